"""A provider name that changes hands leaves the previous owner's data archived (migration 0015).

Team A's resource owns ``stripe`` and has pending, processing, dead and done events, dedup keys
and entity states; it releases the name (or is proven deleted) and team B's resource claims it.
Nothing of A's reaches B: B's statistics, replay, workers and tenant role see none of it, and a
partner of B's that reuses one of A's event ids is stored as new. A's rows still exist, unchanged,
under the archival name ``stripe@<A's uid>``, which no provider can have (a name is a DNS label).
Events stored under the name after A released it (a receiver not yet reloaded) join A's archive.
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from hookline.core import db
from hookline.core.provider_spec import SpecError, parse_provider
from hookline.core.queue import INBOX
from hookline.receiver.group_commit import INSERT_BATCH
from hookline_operator import tenancy
from hookline_operator.ownership import Resource
from hookline_operator.reconcile import claim_row, release_row
from hookline_operator.tokens import replay_owned_dead

pytestmark = pytest.mark.asyncio(loop_scope="session")

SPEC = {"signature": {"scheme": "none"}, "destination": {"url": "http://x.invalid/"}}
ARCHIVED = "stripe@{uid}"
STATES = ("pending", "processing", "dead", "done")


def resource(namespace: str) -> Resource:
    return Resource(namespace, "stripe", str(uuid.uuid4()), 1)


async def receive(pool: asyncpg.Pool, provider: str, event_ids: list[str]) -> set[str]:
    """Store events as the receiver does (dedup keys first); the ids stored now."""
    n = len(event_ids)
    rows = await pool.fetch(INSERT_BATCH, [provider] * n, event_ids, ["t"] * n, [None] * n,
                            ["{}"] * n, [b"{}"] * n, ["application/json"] * n)
    return {r["event_id"] for r in rows}


async def owner_a_with_history(pool: asyncpg.Pool) -> Resource:
    """A owns ``stripe``: one event in each state (evt_pending, ...), keys and an entity state."""
    team_a = resource("team-a")
    assert (await claim_row(pool, team_a, SPEC, [])).owned
    assert await receive(pool, "stripe", [f"evt_{state}" for state in STATES]) == {f"evt_{s}" for s in STATES}
    await pool.execute("UPDATE hookline.inbox SET status = substr(event_id, 5), attempts = 1 WHERE provider = 'stripe'")
    await pool.execute(
        "INSERT INTO hookline.entity_states (provider, entity_key, state) VALUES ('stripe', 'cus_1', 'a')")
    return team_a


async def inbox_of(pool: asyncpg.Pool, provider: str) -> dict[str, str]:
    rows = await pool.fetch("SELECT event_id, status FROM hookline.inbox WHERE provider = $1", provider)
    return {r["event_id"]: r["status"] for r in rows}


async def assert_archived(pool: asyncpg.Pool, team_a: Resource) -> None:
    archived = ARCHIVED.format(uid=team_a.uid)
    assert await inbox_of(pool, archived) == {f"evt_{s}": s for s in STATES}
    assert {r["event_id"] for r in await pool.fetch(
        "SELECT event_id FROM hookline.inbox_keys WHERE provider = $1", archived)} == {f"evt_{s}" for s in STATES}
    assert await pool.fetchval("SELECT state FROM hookline.entity_states WHERE provider = $1", archived) == "a"


async def assert_b_sees_nothing_of_a(pool: asyncpg.Pool, team_b: Resource) -> None:
    assert await inbox_of(pool, "stripe") == {}
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox_keys WHERE provider = 'stripe'") == 0
    assert await pool.fetchval("SELECT count(*) FROM hookline.entity_states WHERE provider = 'stripe'") == 0
    stats = {r["provider"]: r for r in await pool.fetch(db.query("provider_stats"))}
    assert "stripe" not in stats  # B's status: no backlog, nothing dead
    async with pool.acquire() as conn:
        assert await replay_owned_dead(conn, "stripe", team_b.uid) == (True, 0)
    assert await INBOX.claim(pool, "stripe", 10, "worker-b", 30.0) == []  # B's workers get none of A's


async def test_a_release_archives_the_owners_events_and_the_next_owner_starts_empty(pool: asyncpg.Pool,
                                                                                    database_url: str) -> None:
    team_a = await owner_a_with_history(pool)
    assert await release_row(pool, team_a)
    assert await pool.fetchval("SELECT count(*) FROM hookline.providers") == 0
    await assert_archived(pool, team_a)

    team_b = resource("team-b")
    assert (await claim_row(pool, team_b, SPEC, [])).owned
    await assert_b_sees_nothing_of_a(pool, team_b)
    await assert_archived(pool, team_a)  # states unchanged: the dead letter was not requeued
    # B's partner is another sender: an id A's partner once used is B's new event.
    assert await receive(pool, "stripe", ["evt_dead"]) == {"evt_dead"}
    assert await inbox_of(pool, "stripe") == {"evt_dead": "pending"}
    await assert_tenant_of_b_reads_none_of_a(pool, database_url, team_b)


async def test_events_stored_while_the_name_was_free_are_not_the_next_owners(pool: asyncpg.Pool) -> None:
    team_a = await owner_a_with_history(pool)
    assert await release_row(pool, team_a)
    # A receiver that has not yet reloaded its providers still accepts A's partner's event.
    assert await receive(pool, "stripe", ["evt_late"]) == {"evt_late"}
    team_b = resource("team-b")
    assert (await claim_row(pool, team_b, SPEC, [])).owned
    await assert_b_sees_nothing_of_a(pool, team_b)
    archived = await inbox_of(pool, ARCHIVED.format(uid=team_a.uid))
    assert archived == {"evt_late": "pending", **{f"evt_{s}": s for s in STATES}}


async def test_a_takeover_from_an_owner_proven_gone_archives_its_events(pool: asyncpg.Pool) -> None:
    team_a = await owner_a_with_history(pool)
    team_b = resource("team-b")
    assert (await claim_row(pool, team_b, SPEC, [], replaces_uid=team_a.uid)).owned
    await assert_b_sees_nothing_of_a(pool, team_b)
    await assert_archived(pool, team_a)


async def test_the_owner_resyncing_keeps_its_events_and_the_cli_moves_none(pool: asyncpg.Pool) -> None:
    team_a = await owner_a_with_history(pool)
    assert (await claim_row(pool, team_a, {**SPEC, "destination": {"url": "http://y.invalid/"}}, [])).owned
    assert await inbox_of(pool, "stripe") == {f"evt_{s}": s for s in STATES}
    # A name the CLI owns is deleted (to be applied again by the same administrator): its events stay...
    await pool.execute("INSERT INTO hookline.providers (name, spec) VALUES ('cli-made', '{}')")
    await receive(pool, "cli-made", ["evt_1"])
    assert await pool.fetchval(db.query("delete_provider"), "cli-made")
    assert await inbox_of(pool, "cli-made") == {"evt_1": "pending"}
    # ...or hands the name to a resource (README): its events go with it, as before.
    assert (await claim_row(pool, Resource("team-a", "cli-made", str(uuid.uuid4()), 1), SPEC, [])).owned
    assert await inbox_of(pool, "cli-made") == {"evt_1": "pending"}


async def test_an_archival_name_is_never_a_provider_name() -> None:
    with pytest.raises(SpecError, match="DNS label"):
        parse_provider(f"stripe@{uuid.uuid4()}", SPEC)


async def assert_tenant_of_b_reads_none_of_a(pool: asyncpg.Pool, database_url: str, team_b: Resource) -> None:
    database = await pool.fetchval("SELECT current_database()")
    role, password = tenancy.role_name(database, team_b.uid), f"pw-{uuid.uuid4().hex}"
    assert await tenancy.ensure_role(pool, role, "team-b", team_b.uid, password) is None
    tenant = await asyncpg.connect(tenancy.tenant_url(database_url, role, password))
    try:
        assert await tenant.fetchval("SELECT count(*) FROM hookline.inbox") == 1  # B's own event only
        assert {r["provider"] for r in await tenant.fetch("SELECT provider FROM hookline.inbox")} == {"stripe"}
        assert await tenant.fetchval("SELECT count(*) FROM hookline.entity_states") == 0
        assert await tenant.execute("UPDATE hookline.inbox SET status = 'pending' WHERE provider LIKE 'stripe@%'") \
            == "UPDATE 0"
    finally:
        await tenant.close()
        await pool.execute("SELECT hookline.drop_tenant($1)", role)
