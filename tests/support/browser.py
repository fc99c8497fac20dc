"""Debian's Chromium, driven by Playwright (``make browser``, tests/browser/install.sh).

Playwright is pointed at the system browser: ``playwright install`` downloads its own, which we never
do. A test that needs a missing browser is skipped, or fails where the run requires it (CI:
HOOKLINE_REQUIRE_BROWSER=1).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from support.tools import unavailable

if TYPE_CHECKING:
    from playwright.async_api import Browser

CHROMIUM = Path("/usr/bin/chromium")
REQUIRED_BY = "HOOKLINE_REQUIRE_BROWSER"


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """A headless Chromium for the length of the block (Playwright's async API: the tests' servers
    run in the same event loop)."""
    if not CHROMIUM.exists():
        unavailable("Debian's chromium is not installed (make browser)", REQUIRED_BY)
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        unavailable("playwright is not installed (the test extra: make test)", REQUIRED_BY)
    # As root Chromium refuses to start inside its sandbox; in a container there is no other user.
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        try:
            yield browser
        finally:
            await browser.close()
