"""Debian's Chromium, driven by Playwright (``make browser``, tests/browser/install.sh).

Playwright is pointed at the system browser: ``playwright install`` downloads its own, which we never
do. A test that needs a missing browser is skipped, or fails where the run requires it (CI:
HOOKLINE_REQUIRE_BROWSER=1).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from support.tools import unavailable

if TYPE_CHECKING:
    from playwright.sync_api import Browser

CHROMIUM = Path("/usr/bin/chromium")
REQUIRED_BY = "HOOKLINE_REQUIRE_BROWSER"


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium for the length of the block."""
    if not CHROMIUM.exists():
        unavailable("Debian's chromium is not installed (make browser)", REQUIRED_BY)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (the test extra: make test)", REQUIRED_BY)
    # As root Chromium refuses to start inside its sandbox; in a container there is no other user.
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        try:
            yield browser
        finally:
            browser.close()
