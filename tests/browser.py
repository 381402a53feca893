"""A page opened offline in the system's headless Chromium (through Playwright), as the report tests open it.

Playwright is pointed at the installed browser (``/usr/bin/chromium``, or ``$BOUTE_CHROMIUM``): it never
downloads its own. Every request the page makes is routed here: ``file:`` requests (the page itself) go
through, any other is refused and recorded, so a test can assert that the page asked the network for
nothing. Console errors and uncaught page errors are recorded too.

``python -m tests.browser PAGE.html SHOT.png`` writes a full-page screenshot (the README's report picture).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1180, "height": 900}


def chromium() -> Path | None:
    """The system's Chromium, or None."""
    named = os.environ.get("BOUTE_CHROMIUM")
    if named:
        return Path(named) if Path(named).is_file() else None
    for name in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if Path(name).is_file():
            return Path(name)
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    return Path(found) if found else None


def missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -c constraints.txt -e '.[dev]')"
    if chromium() is None:
        return "no system Chromium (/usr/bin/chromium; apt-get install chromium, or set BOUTE_CHROMIUM)"
    return None


@dataclass
class Visit:
    """What happened while a page was open: requests refused (non-``file:`` URLs) and console errors."""

    page: Any
    blocked: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@contextmanager
def offline_page(html: Path) -> Iterator[Visit]:
    """``html`` opened in headless Chromium with the network refused (module doc), fully loaded."""
    from playwright.sync_api import sync_playwright

    exe = chromium()
    assert exe is not None, missing()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(exe), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
            visit = Visit(page)

            def route(r: Any) -> None:
                if r.request.url.startswith("file:"):
                    r.continue_()
                else:
                    visit.blocked.append(r.request.url)
                    r.abort()

            page.route("**/*", route)
            page.on("console", lambda m: visit.errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: visit.errors.append(str(e)))
            page.goto(html.resolve().as_uri(), wait_until="load")
            yield visit
        finally:
            browser.close()


def screenshot(html: Path, png: Path) -> Visit:
    """A full-page screenshot of ``html`` written to ``png``; the visit (what was blocked, what erred)."""
    png.parent.mkdir(parents=True, exist_ok=True)
    with offline_page(html) as visit:
        visit.page.screenshot(path=str(png), full_page=True)
        return visit


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m tests.browser PAGE.html SHOT.png")
    why = missing()
    if why:
        sys.exit(why)
    v = screenshot(Path(sys.argv[1]), Path(sys.argv[2]))
    if v.blocked or v.errors:
        sys.exit(f"the page asked for {v.blocked} and logged errors {v.errors}")
    print(f"screenshot written: {sys.argv[2]}")
