"""The console in a real browser as a team's ServiceAccount, against the real kube-apiserver.

A real ``hookline console --auth kubernetes`` process (as the chart's console ServiceAccount) serves
team-a's and team-b's providers from the database; Debian's Chromium logs in through the login page
with team-a reader's real token. Nothing of team-b reaches a page: not its provider, not its events,
and its event's own URL is the same 404 page as an event that does not exist. The same token on the
JSON API gets 404 for team-b's event and 403 for a replay of team-a's dead letter (it reads, it may not
patch). The run fails on any CSP violation, and the token never appears in the console's logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import asyncpg

from support.browser import chromium
from support.console_kube import World
from support.inbox import insert_events

if TYPE_CHECKING:
    from playwright.async_api import Page


async def texts(page: Page) -> str:
    """What the page shows and what its HTML holds (option values, links, hidden fields)."""
    return await page.locator("body").inner_text() + "\n" + await page.content()


async def test_team_a_reader_sees_nothing_of_team_b_in_the_browser_or_the_api(
        world: World, database_url: str, pool: asyncpg.Pool, log_dir: Path) -> None:
    from playwright.async_api import expect

    await world.store_providers(database_url, pool)
    [event_a] = await insert_events(pool, world.provider_a, 1, event_type="order.paid")
    [dead_a] = await insert_events(pool, world.provider_a, 1, event_type="order.refunded")
    [event_b] = await insert_events(pool, world.provider_b, 1, event_type="invoice.paid")
    [event_unowned] = await insert_events(pool, world.unowned, 1, event_type="cli.event")
    await pool.execute("UPDATE hookline.inbox SET status = 'dead', attempts = 1, last_error = 'boom' "
                       "WHERE event_id = $1", dead_a)
    # Whatever names team-b's provider or event, or the provider no team owns: none may reach a page.
    hidden = [world.provider_b, world.whp_b, world.team_b, event_b, world.unowned, event_unowned]
    proc = world.start_console(database_url, log_dir)
    try:
        async with chromium() as browser:
            page = await browser.new_page()
            violations: list[str] = []
            page.on("console", lambda message: violations.append(message.text)
                    if "Content Security Policy" in message.text else None)

            await page.goto(proc.url + "/events")
            await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
            # A token with the reader's claims and a signature of our own: the TokenReview refuses it.
            header, payload, _ = world.reader.split(".")
            await page.get_by_label("Token").fill(f"{header}.{payload}.c2lnbmF0dXJl")
            await page.get_by_role("button", name="Log in").click()
            await expect(page.get_by_role("alert")).to_have_text("That token was not accepted.")

            await page.get_by_label("Token").fill(world.reader)
            await page.get_by_role("button", name="Log in").click()
            await expect(page.get_by_role("heading", name="Events")).to_be_visible()
            await expect(page.locator(".subject")).to_have_text(f"system:serviceaccount:{world.team_a}:reader")
            rows = page.locator("table.events tbody tr")
            await expect(rows).to_have_count(2)
            await expect(page.get_by_role("link", name=event_a)).to_be_visible()
            await expect(page.get_by_role("link", name=dead_a)).to_be_visible()
            shown = await texts(page)
            assert not [name for name in hidden if name in shown]

            await page.get_by_role("link", name="Providers").click()
            await expect(page.get_by_role("heading", name="Providers")).to_be_visible()
            await expect(page.get_by_role("link", name=world.provider_a)).to_be_visible()
            await expect(page.locator("main table tbody tr")).to_have_count(1)
            await expect(page.locator("main")).to_contain_text(f"{world.team_a}/{world.whp_a}")
            shown = await texts(page)
            assert not [name for name in hidden if name in shown]

            # The reader's own dead letter: listed, but with nothing to replay it with.
            await page.goto(f"{proc.url}/dead-letters?provider={world.provider_a}")
            await expect(page.get_by_role("link", name=dead_a)).to_be_visible()
            await expect(page.get_by_role("checkbox")).to_have_count(0)
            await expect(page.get_by_role("button", name="Replay selected…")).to_have_count(0)

            # team-b's event by its URL: the page for what does not exist, so nothing says it does.
            answered = await page.goto(f"{proc.url}/events/{world.provider_b}/{event_b}")
            assert answered is not None and answered.status == 404
            await expect(page.get_by_role("heading", name="404")).to_be_visible()
            not_found = await page.locator("main").inner_text()
            assert "Nothing here you may read." in not_found
            assert not [name for name in hidden if name in await page.locator("body").inner_text()]
            answered = await page.goto(f"{proc.url}/events/{world.provider_a}/evt_no_such_event")
            assert answered is not None and answered.status == 404
            assert await page.locator("main").inner_text() == not_found

            assert world.reader not in await page.content()  # the session cookie is HttpOnly
            assert violations == []

        async with aiohttp.ClientSession(base_url=proc.url,
                                         headers={"Authorization": f"Bearer {world.reader}"}) as http:
            async with http.get(f"/api/v1/events/{world.provider_b}/{event_b}") as answer:
                assert answer.status == 404
                assert answer.content_type == "application/problem+json"
            async with http.get(f"/api/v1/events/{world.provider_a}/{event_a}") as answer:
                assert answer.status == 200  # the same token does read its own team's event
            async with http.post(f"/api/v1/events/{world.provider_a}/{dead_a}/replay", json={}) as answer:
                assert answer.status == 403, await answer.text()
        assert await pool.fetchval("SELECT status FROM hookline.inbox WHERE event_id = $1", dead_a) == "dead"
    finally:
        proc.stop()
    assert world.reader not in proc.logs()
