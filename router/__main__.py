"""``python -m router``: run the gateway (see router.server)."""

import sys

from router.server import main

sys.exit(main())
