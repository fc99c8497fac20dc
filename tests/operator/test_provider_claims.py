"""Who owns a public provider name, decided in Postgres (real database, no Kubernetes).

The operator claims a name with ``claim_provider`` (reconcile.claim_row), releases it with
``release_provider``; the CLI writes only rows no resource owns. See migration 0005.
"""

from __future__ import annotations

import json

import asyncpg
import pytest

from hookline.core import db, migrations, providers
from hookline.core.providers import ProviderOwned, stored_secrets
from hookline.core.secrets_at_rest import configured_ring
from hookline.core.signatures import get_scheme
from hookline_operator.ownership import CLI_OWNER, LEGACY_OWNER, ClaimState, Resource
from hookline_operator.reconcile import claim_and_sync, claim_row, describe_secret, release_row
from hookline_operator.tokens import replay_owned_dead
from support.inbox import insert_events
from support.processes import hookline_cli

pytestmark = pytest.mark.asyncio(loop_scope="session")

TEAM_A = Resource("team-a", "stripe", "uid-a", 1)
TEAM_B = Resource("team-b", "stripe", "uid-b", 1)


def spec(url: str) -> dict[str, object]:
    return {"signature": {"scheme": "standard-webhooks"}, "destination": {"url": url}}


def secrets(value: str) -> list[dict[str, object]]:
    return [{"value": value, "notAfter": None}]


async def row(pool: asyncpg.Pool, name: str = "stripe") -> asyncpg.Record:
    return await pool.fetchrow("SELECT * FROM hookline.providers WHERE name = $1", name)


async def test_the_first_claimant_owns_the_name_and_a_second_is_refused_without_the_owner(pool) -> None:
    first = await claim_row(pool, TEAM_A, spec("http://a.team-a.svc/"), secrets("whsec_a"))
    assert first.owned
    second = await claim_row(pool, TEAM_B, spec("http://b.team-b.svc/"), secrets("whsec_b"))
    assert second.state is ClaimState.CONFLICT
    assert (second.owner, second.owner_uid) == ("WebhookProvider team-a/stripe", "uid-a")
    assert "team-a" not in second.message("stripe") and "already taken" in second.message("stripe")
    stored = await row(pool)
    assert stored["spec"]["destination"]["url"] == "http://a.team-a.svc/"  # team B changed nothing
    assert [s["value"] for s in stored_secrets(configured_ring(), "stripe", stored["secrets"])] == ["whsec_a"]
    assert "whsec_a" not in json.dumps(stored["secrets"])  # encrypted at rest
    assert (stored["managed_by"], stored["owner_namespace"], stored["owner_name"], stored["owner_uid"]) == \
        ("operator", "team-a", "stripe", "uid-a")


async def test_the_owner_resyncs_and_an_unchanged_spec_writes_no_new_row_version(pool) -> None:
    await claim_row(pool, TEAM_A, spec("http://a/"), secrets("whsec_a"))
    before = (await row(pool))["updated_at"]
    assert (await claim_row(pool, TEAM_A, spec("http://a/"), secrets("whsec_a"))).owned
    assert (await row(pool))["updated_at"] == before
    assert (await claim_row(pool, TEAM_A, spec("http://a2/"), secrets("whsec_a"))).owned
    assert (await row(pool))["spec"]["destination"]["url"] == "http://a2/"


async def test_only_the_owner_releases_and_then_the_other_claimant_takes_over(pool) -> None:
    await claim_row(pool, TEAM_A, spec("http://a/"), secrets("whsec_a"))
    assert not await release_row(pool, TEAM_B)
    assert await row(pool) is not None
    assert await release_row(pool, TEAM_A)
    assert (await claim_row(pool, TEAM_B, spec("http://b/"), secrets("whsec_b"))).owned
    assert (await row(pool))["owner_namespace"] == "team-b"


async def test_an_owner_proven_gone_is_replaced_and_no_one_else(pool) -> None:
    await claim_row(pool, TEAM_A, spec("http://a/"), secrets("whsec_a"))
    wrong = await claim_row(pool, TEAM_B, spec("http://b/"), secrets("whsec_b"), replaces_uid="uid-other")
    assert wrong.state is ClaimState.CONFLICT
    taken = await claim_row(pool, TEAM_B, spec("http://b/"), secrets("whsec_b"), replaces_uid="uid-a")
    assert taken.owned
    assert (await row(pool))["owner_uid"] == "uid-b"


async def test_the_cli_never_changes_or_deletes_a_name_a_resource_owns(pool) -> None:
    await claim_row(pool, TEAM_A, spec("http://a/"), secrets("whsec_a"))
    async with pool.acquire() as conn:
        with pytest.raises(ProviderOwned, match="team-a/stripe"):
            await providers.upsert(conn, "stripe", spec("http://cli/"), secrets("whsec_cli"))
        with pytest.raises(ProviderOwned, match="team-a/stripe"):
            await providers.delete(conn, "stripe")
        assert await providers.delete(conn, "nothing-here") is False
    assert (await row(pool))["spec"]["destination"]["url"] == "http://a/"


async def test_a_cli_provider_is_never_taken_over_by_the_operator(pool) -> None:
    async with pool.acquire() as conn:
        await providers.upsert(conn, "stripe", spec("http://cli/"), secrets("whsec_cli"))
    claim = await claim_row(pool, TEAM_A, spec("http://a/"), secrets("whsec_cli"))
    assert (claim.state, claim.owner) == (ClaimState.CONFLICT, CLI_OWNER)
    assert (await row(pool))["spec"]["destination"]["url"] == "http://cli/"
    async with pool.acquire() as conn:  # the CLI hands it over by deleting it
        assert await providers.delete(conn, "stripe")
    assert (await claim_row(pool, TEAM_A, spec("http://a/"), secrets("whsec_a"))).owned


async def legacy_row(pool: asyncpg.Pool, name: str, spec_: dict[str, object], secrets_: list[dict[str, object]]
                     ) -> None:
    # As migration 0005 leaves a row written before it: no owner, managed_by NULL.
    await pool.execute("INSERT INTO hookline.providers (name, spec, secrets, managed_by) VALUES ($1, $2, $3, NULL)",
                       name, spec_, secrets_)


async def test_a_row_from_before_ownership_goes_to_the_resource_whose_secret_it_holds(pool) -> None:
    await legacy_row(pool, "stripe", spec("http://a/"), secrets("whsec_a"))
    other = await claim_row(pool, TEAM_B, spec("http://b/"), secrets("whsec_b"))
    assert (other.state, other.owner) == (ClaimState.CONFLICT, LEGACY_OWNER)
    assert (await claim_row(pool, TEAM_A, spec("http://a/"), secrets("whsec_a"))).owned
    assert (await row(pool))["owner_uid"] == "uid-a"


async def test_a_row_from_before_ownership_without_a_secret_goes_to_the_resource_with_its_spec(pool) -> None:
    none = {"signature": {"scheme": "none"}, "handler": "pkg.mod:fn"}
    await legacy_row(pool, "open", none, [])
    other = Resource("team-b", "open", "uid-b", 1)
    assert not (await claim_row(pool, other, {**none, "handler": "other.mod:fn"}, [])).owned
    assert (await claim_row(pool, Resource("team-a", "open", "uid-a", 1), none, [])).owned


async def test_a_row_from_before_ownership_goes_to_the_cli_when_it_applies_it(pool) -> None:
    await legacy_row(pool, "stripe", spec("http://a/"), secrets("whsec_a"))
    async with pool.acquire() as conn:
        await providers.upsert(conn, "stripe", spec("http://cli/"), secrets("whsec_cli"))
    assert (await row(pool))["managed_by"] == "cli"


async def test_replay_requeues_only_for_the_owner(pool) -> None:
    await claim_row(pool, TEAM_A, spec("http://a/"), secrets("whsec_a"))
    await insert_events(pool, "stripe", 3)
    await pool.execute("UPDATE hookline.inbox SET status = 'dead'")
    async with pool.acquire() as conn:
        assert await replay_owned_dead(conn, "stripe", "uid-b") == (False, 0)
    assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE status = 'dead'") == 3
    async with pool.acquire() as conn:
        assert await replay_owned_dead(conn, "stripe", "uid-a") == (True, 3)


async def test_the_owner_check_holds_in_the_schema_itself(pool) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute("INSERT INTO hookline.providers (name, spec, managed_by, owner_uid) "
                           "VALUES ('x', '{}', 'operator', 'uid')")


async def test_the_cli_says_who_owns_a_name_and_changes_nothing(pool, database_url) -> None:
    await claim_row(pool, TEAM_A, spec("http://a/"), secrets(get_scheme("standard-webhooks").generate_secret()))
    doc = "kind: WebhookProvider\nmetadata: {name: stripe}\nspec:\n  signature: {scheme: standard-webhooks}\n" \
          "  destination: {url: 'http://cli/'}\n"
    applied = hookline_cli(database_url, "providers", "apply", "-f", "-", stdin=doc)
    assert applied.returncode != 0
    assert "WebhookProvider team-a/stripe" in applied.stderr and "nothing was applied" in applied.stderr
    deleted = hookline_cli(database_url, "providers", "delete", "stripe")
    assert deleted.returncode != 0 and "team-a/stripe" in deleted.stderr
    listed = hookline_cli(database_url, "providers", "list")
    assert "WebhookProvider team-a/stripe" in listed.stdout
    assert (await row(pool))["spec"]["destination"]["url"] == "http://a/"


async def test_migration_0005_leaves_earlier_rows_unrecorded_and_their_resource_adopts_them(pg_server) -> None:
    admin = await asyncpg.connect(pg_server.admin_url)
    name = "t_premigration_" + TEAM_A.uid.replace("-", "_")
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    conn = await asyncpg.connect(pg_server.url_for(name))
    try:
        await conn.execute("CREATE SCHEMA hookline")
        for version, _file, sql in migrations.available():
            if version <= 4:
                await conn.execute(sql)
        # What the operator wrote before ownership was recorded: name, spec and secrets only.
        await conn.execute("INSERT INTO hookline.providers (name, spec, secrets) VALUES ('stripe', $1, $2)",
                           json.dumps(spec("http://a/")), json.dumps(secrets("whsec_a")))
        await conn.execute(next(sql for version, _file, sql in migrations.available() if version == 5))
        before = await conn.fetchrow("SELECT managed_by, owner_uid FROM hookline.providers")
        assert (before["managed_by"], before["owner_uid"]) == (None, None)
    finally:
        await conn.close()
    pool = await db.create_pool(pg_server.url_for(name), max_size=2)
    try:
        assert not (await claim_row(pool, TEAM_B, spec("http://b/"), secrets("whsec_b"))).owned
        assert (await claim_row(pool, TEAM_A, spec("http://a/"), secrets("whsec_a"))).owned
    finally:
        await pool.close()
        await pg_server.drop_database(name)


async def test_an_unchanged_provider_skips_the_claim_until_the_resync_is_due(pool) -> None:
    spec_ = {"signature": {"scheme": "none"}, "destination": {"url": "http://a/"}}
    secret = describe_secret(TEAM_A, spec_, None)
    first = await claim_and_sync(pool, None, TEAM_A, spec_, secret)  # type: ignore[arg-type]  # no conflict: no API
    assert first.synced and first.verified is not None
    await pool.execute("DELETE FROM hookline.providers")  # behind the operator's back
    skipped = await claim_and_sync(pool, None, TEAM_A, spec_, secret, first.verified, 3600)  # type: ignore[arg-type]
    assert skipped.synced and skipped.verified is None
    assert await row(pool) is None
    changed = {**spec_, "destination": {"url": "http://a2/"}}  # a change is synced at once
    assert (await claim_and_sync(pool, None, TEAM_A, changed, secret, first.verified, 3600)).verified  # type: ignore[arg-type]
    await pool.execute("DELETE FROM hookline.providers")
    due = await claim_and_sync(pool, None, TEAM_A, spec_, secret, first.verified, 0)  # type: ignore[arg-type]
    assert due.verified is not None and await row(pool) is not None  # the resync repairs the row
