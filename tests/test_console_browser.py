"""The console in a real browser (Debian's Chromium driven by Playwright), over real processes.

Signed events go through a real receiver to a real worker whose handler fails one of them until a
fix is "deployed"; the browser logs in with the token, filters the events list, opens an event,
replays the dead letter through the confirmation step and sees the worker get it done. It fails on
any CSP violation, and takes the README's screenshots: into the test's tmp_path, or over
docs/images/console-*.png when HOOKLINE_WRITE_SCREENSHOTS=1 (`make screenshots`), so that an
ordinary run leaves the tree clean.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from hookline.core.embedded import free_port
from support.browser import chromium
from support.inbox import apply_provider
from support.processes import ServiceProcess, receiver, worker
from support.senders import SW_SECRET, standard_webhooks
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOKEN = "browser-test-token-0123456789abcdef"
IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
WRITE_SCREENSHOTS = "HOOKLINE_WRITE_SCREENSHOTS"
SCREENSHOTS = ("console-providers.png", "console-events.png", "console-event.png")
PROVIDER = f"""
signature: {{scheme: standard-webhooks, secrets: ["{SW_SECRET}"]}}
eventType: {{jsonPointer: /type}}
handler: "support.handlers:fail_until_fixed"
retry: {{maxAttempts: 2, initialDelaySeconds: 0.05, maxDelaySeconds: 0.1}}
"""
EVENTS = [  # (event id, type, order); every one but evt_broken has its fix deployed before it arrives
    ("msg_2Xk1paid", "order.paid", "ord_1001"),
    ("msg_2Xk2paid", "order.paid", "ord_1002"),
    ("msg_2Xk3refund", "order.refunded", "ord_1001"),
    ("msg_2Xk4shipped", "order.shipped", "ord_1002"),
    ("evt_broken", "order.refunded", "ord_1003"),
]


@pytest.fixture
async def stack(database_url: str, pool: asyncpg.Pool, log_dir: Path) -> AsyncIterator[tuple[str, ServiceProcess]]:
    """Receiver, worker and ``hookline console`` processes (the console's URL first)."""
    await pool.execute("CREATE TABLE test_fixes (event_id text PRIMARY KEY)")
    await pool.executemany("INSERT INTO test_fixes VALUES ($1)", [(e,) for e, _, _ in EVENTS if e != "evt_broken"])
    apply_provider(database_url, "shop", PROVIDER)
    receiving = receiver(database_url, log_dir)
    working = worker(database_url, log_dir, "--provider", "shop")
    port = free_port()
    console = ServiceProcess(["console", "--port", str(port)], database_url, log_dir, port=port,
                             env={"HOOKLINE_CONSOLE_TOKEN": TOKEN}).start("/readyz")
    try:
        yield console.url, receiving
    finally:
        console.stop()
        assert TOKEN not in console.logs()  # given, so never printed nor logged
        working.stop()
        receiving.stop()


async def send_signed_events(receiving: ServiceProcess) -> None:
    async with aiohttp.ClientSession() as http:
        for event_id, event_type, order in EVENTS:
            body = json.dumps({"type": event_type, "data": {"order": order, "amount": 4200, "currency": "eur",
                                                            "note": "<script>alert('hi')</script>"}}).encode()
            async with http.post(f"{receiving.url}/webhooks/shop", data=body,
                                 headers={**standard_webhooks(body, event_id), "Content-Type": "application/json"}
                                 ) as response:
                assert response.status == 200, await response.text()


async def test_log_in_filter_open_and_replay_a_dead_letter(stack: tuple[str, ServiceProcess],
                                                           pool: asyncpg.Pool, tmp_path: Path) -> None:
    from playwright.async_api import expect

    console, receiving = stack
    images = IMAGES if os.environ.get(WRITE_SCREENSHOTS) == "1" else tmp_path
    await send_signed_events(receiving)

    async def statuses() -> dict[str, str]:
        return {r["event_id"]: r["status"] for r in await pool.fetch("SELECT event_id, status FROM hookline.inbox")}
    await eventually(statuses, equals={e: "dead" if e == "evt_broken" else "done" for e, _, _ in EVENTS},
                     what="the worker to finish the signed events")

    async with chromium() as browser:
        page = await browser.new_page(viewport={"width": 1280, "height": 860})
        violations: list[str] = []
        page.on("console", lambda message: violations.append(message.text)
                if "Content Security Policy" in message.text else None)

        await page.goto(console + "/events")
        await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
        await page.get_by_label("Token").fill(TOKEN)
        await page.get_by_role("button", name="Log in").click()
        await expect(page.get_by_role("heading", name="Events")).to_be_visible()
        await expect(page.locator("table.events tbody tr")).to_have_count(len(EVENTS))

        await page.goto(console + "/")
        await expect(page.get_by_role("link", name="shop")).to_be_visible()
        await page.screenshot(path=str(images / "console-providers.png"), full_page=True)

        await page.get_by_role("link", name="Events", exact=True).click()
        await page.get_by_label("Event type").fill("order.refunded")
        await page.get_by_role("button", name="Filter").click()
        await expect(page.locator("table.events tbody tr")).to_have_count(2)
        await expect(page).to_have_url(f"{console}/events?provider=&status=&type=order.refunded&entity=&"
                                       "received_after=&received_before=&q=")
        await page.screenshot(path=str(images / "console-events.png"), full_page=True)

        await page.get_by_role("link", name="msg_2Xk3refund").click()
        await expect(page.get_by_role("heading", name="Event msg_2Xk3refund")).to_be_visible()
        body = page.locator("pre.body")
        await expect(body).to_contain_text('"order": "ord_1001"')
        await expect(body).to_contain_text("<script>alert('hi')</script>")  # shown as text, never run
        await expect(page.locator("table.headers")).to_contain_text("webhook-id")
        assert SW_SECRET not in await page.content()
        await page.screenshot(path=str(images / "console-event.png"), full_page=True)

        await page.get_by_role("link", name="Dead letters").click()
        await page.get_by_label("Provider").select_option("shop")
        await page.get_by_role("button", name="Filter").click()
        await expect(page.locator("table.events tbody tr")).to_have_count(1)
        await page.get_by_role("checkbox").check()
        await page.get_by_role("button", name="Replay selected…").click()
        await expect(page.get_by_role("heading", name="Replay 1 dead letter?")).to_be_visible()
        assert (await statuses())["evt_broken"] == "dead"  # only the confirmation replays

        await pool.execute("INSERT INTO test_fixes VALUES ('evt_broken')")
        await page.get_by_role("button", name="Replay 1").click()
        await expect(page.get_by_role("status")).to_contain_text("1 dead letter replayed")
        await eventually(lambda: statuses(), equals={e: "done" for e, _, _ in EVENTS},
                         what="the worker to get the replayed dead letter done")

        await page.goto(console + "/events/shop/evt_broken")
        await expect(page.locator("dl.facts")).to_contain_text("done")
        await expect(page.locator("ol.timeline")).to_contain_text("replayed")
        assert violations == []
    for name in SCREENSHOTS:
        assert (images / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name
