"""``python -m backends.emulated``: see backends.emulated.server."""

import sys

from backends.emulated.server import main

sys.exit(main())
