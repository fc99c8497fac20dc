"""Signing secrets encrypted at rest (core/secrets_at_rest.py, core/stored_secrets.py): the key file,
the sealed format and its binding to a row, every write path leaving only ciphertext in Postgres,
a key rotation online, the upgrade that seals plaintext in place, and the services reading it all."""

from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from standardwebhooks import Webhook

from hookline.core import db, migrations, providers, secrets_at_rest, stored_secrets
from hookline.core.secrets_at_rest import KeyRing, SealedValueError, SecretKeyError
from hookline.relay import endpoints
from support import senders
from support.postgres import PgServer
from support.processes import hookline_cli, receiver

SECRET = senders.SW_SECRET
STRIPE = senders.STRIPE_SECRET
PROVIDERS = f"""
kind: WebhookProvider
metadata: {{name: sw}}
spec:
  signature: {{scheme: standard-webhooks, secrets: ["{SECRET}"]}}
  destination: {{url: "http://127.0.0.1:9/hook"}}
---
kind: WebhookProvider
metadata: {{name: stripe}}
spec:
  handler: "hookline.examples.handlers:log_event"
  signature: {{scheme: stripe, secrets: ["{STRIPE}"]}}
"""


def _keys_file(path: Path, *keys: str) -> Path:
    path.write_text("".join(k + "\n" for k in keys))
    return path


@pytest.fixture
def use_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[object]:
    """``use_keys(*lines)`` points HOOKLINE_SECRET_KEYS_FILE at a new file holding those lines."""
    counter = iter(range(1000))

    def use(*keys: str) -> Path:
        path = _keys_file(tmp_path / f"keys-{next(counter)}", *keys)
        monkeypatch.setenv(secrets_at_rest.KEYS_FILE_ENV, str(path))
        return path

    yield use


async def _raw_rows(conn: asyncpg.Connection | asyncpg.Pool) -> str:
    """Every secret-holding table as pg_dump or a replica reader would see it."""
    texts = [r[0] for r in await conn.fetch("SELECT row_to_json(p)::text FROM hookline.providers AS p")]
    texts += [r[0] for r in await conn.fetch("SELECT row_to_json(e)::text FROM hookline.endpoints AS e")]
    return "\n".join(texts)


# -- the key file and the sealed format -----------------------------------------------------------


def test_a_key_file_takes_comments_and_blank_lines_and_the_first_key_seals(tmp_path: Path) -> None:
    first, second = secrets_at_rest.new_key_line(), secrets_at_rest.new_key_line()
    ring = secrets_at_rest.load_keys_file(_keys_file(tmp_path / "k", "# new key first", "", first, "  ", second))
    assert len(ring.ids) == 2
    sealed = ring.seal("whsec_abc", "ctx")
    assert sealed.startswith(f"hl1:{ring.sealing_id}:") and "whsec_abc" not in sealed
    assert ring.open(sealed, "ctx") == "whsec_abc"
    assert ring.seal("whsec_abc", "ctx") != sealed  # a new data key and nonce each time
    assert first not in repr(ring) and second not in repr(ring)


@pytest.mark.parametrize("content, reason", [
    ("c2hvcnQ=\n", "line 1 is not a key"),  # base64, but 5 bytes
    ("# only a comment\n\n", "holds no key"),
    ("not base64 at all!!\n", "line 1 is not a key"),
])
def test_a_bad_key_file_is_one_clear_line_that_never_shows_its_content(tmp_path: Path, content: str,
                                                                       reason: str) -> None:
    path = tmp_path / "keys"
    path.write_text(content)
    with pytest.raises(SecretKeyError) as raised:
        secrets_at_rest.load_keys_file(path)
    message = str(raised.value)
    assert reason in message and str(path) in message and "\n" not in message
    assert "c2hvcnQ" not in message and "base64 at all" not in message


def test_a_repeated_key_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    key = secrets_at_rest.new_key_line()
    with pytest.raises(SecretKeyError, match="line 2 repeats"):
        secrets_at_rest.load_keys_file(_keys_file(tmp_path / "k", key, key))
    with pytest.raises(SecretKeyError, match="cannot read it"):
        secrets_at_rest.load_keys_file(tmp_path / "absent")


def test_a_sealed_value_opens_only_in_its_own_row_and_column_and_untouched() -> None:
    ring = KeyRing.from_keys([os.urandom(32)])
    sealed = ring.seal("whsec_abc", secrets_at_rest.provider_secrets_context("shop"))
    for elsewhere in (secrets_at_rest.provider_secrets_context("other"),
                      secrets_at_rest.destination_secret_context("shop"),
                      secrets_at_rest.endpoint_secrets_context("shop")):
        with pytest.raises(SealedValueError, match="altered, or copied from another row"):
            ring.open(sealed, elsewhere)
    head, _, tail = sealed.rpartition(":")
    flipped = tail[:-2] + ("A" if tail[-2] != "A" else "B") + tail[-1]
    with pytest.raises(SealedValueError):
        ring.open(f"{head}:{flipped}", secrets_at_rest.provider_secrets_context("shop"))
    with pytest.raises(SealedValueError, match="malformed"):
        ring.open("hl1:abc", "x")


def test_a_value_of_a_key_not_in_the_ring_says_which_key_without_any_key() -> None:
    old, new = os.urandom(32), os.urandom(32)
    sealed = KeyRing.from_keys([old]).seal("whsec_abc", "ctx")
    with pytest.raises(SealedValueError) as raised:
        KeyRing.from_keys([new]).open(sealed, "ctx")
    assert secrets_at_rest.key_id(old) in str(raised.value) and "whsec_abc" not in str(raised.value)
    rotated = KeyRing.from_keys([new, old]).reseal(sealed, "ctx")  # the data key re-wrapped, the value kept
    assert KeyRing.from_keys([new]).open(rotated, "ctx") == "whsec_abc"
    assert rotated.rsplit(":", 1)[1] == sealed.rsplit(":", 1)[1]


def test_writing_a_secret_without_a_key_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(secrets_at_rest.KEYS_FILE_ENV)
    with pytest.raises(SecretKeyError, match="HOOKLINE_SECRET_KEYS_FILE"):
        secrets_at_rest.required_ring("storing a secret")
    # A sealed value needs the key to be read; plaintext from before the upgrade is read as it is.
    with pytest.raises(SecretKeyError, match="encrypted at rest"):
        secrets_at_rest.open_value(None, KeyRing.from_keys([os.urandom(32)]).seal("s", "c"), "c")
    assert secrets_at_rest.open_value(None, "plain", "c") == "plain"


def test_dev_makes_an_owner_only_key_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hookline.dev import use_keys_file

    monkeypatch.delenv(secrets_at_rest.KEYS_FILE_ENV)
    path = use_keys_file(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.environ[secrets_at_rest.KEYS_FILE_ENV] == str(path)
    first = path.read_text()
    monkeypatch.delenv(secrets_at_rest.KEYS_FILE_ENV)
    assert use_keys_file(tmp_path) == path and path.read_text() == first  # kept across runs


# -- every write path stores only ciphertext ------------------------------------------------------


async def test_apply_and_endpoints_add_store_only_ciphertext(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        report = await providers.apply_providers(conn, PROVIDERS)
        endpoint_secret = await endpoints.add(conn, "orders", "https://example.com/hook")
    destination_secret = next(line for line in report if "shown once" in line).rsplit(" ", 1)[1]
    raw = await _raw_rows(pool)
    for plaintext in (SECRET, STRIPE, destination_secret, endpoint_secret):
        assert plaintext not in raw
        assert plaintext.removeprefix("whsec_") not in raw
    async with pool.acquire() as conn:
        assert await stored_secrets.count_plaintext(conn) == 0
    values = [r[0] for r in await pool.fetch(
        "SELECT s->>'value' FROM hookline.providers, jsonb_array_elements(secrets) AS s "
        "UNION ALL SELECT destination_secret FROM hookline.providers WHERE destination_secret IS NOT NULL "
        "UNION ALL SELECT s->>'value' FROM hookline.endpoints, jsonb_array_elements(secrets) AS s")]
    assert len(values) == 5 and all(v.startswith("hl1:") for v in values)

    # What the services read is the plaintext again.
    loaded = await providers.load_all(pool)
    assert loaded["sw"].signature.secrets == (SECRET,) and loaded["sw"].destination_secret == destination_secret
    assert loaded["stripe"].signature.secrets == (STRIPE,)
    assert [e.secrets for e in await endpoints.load(pool)] == [(endpoint_secret,)]


async def test_applying_the_same_file_again_rewrites_no_secret(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        await providers.apply_providers(conn, PROVIDERS)
        before = await conn.fetch("SELECT name, secrets, destination_secret FROM hookline.providers ORDER BY name")
        await providers.apply_providers(conn, PROVIDERS)
        assert await conn.fetch("SELECT name, secrets, destination_secret FROM hookline.providers "
                                "ORDER BY name") == before


async def test_a_ciphertext_moved_to_another_row_is_refused_and_the_provider_skipped(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        await providers.apply_providers(conn, PROVIDERS)
    await pool.execute("UPDATE hookline.providers SET secrets = (SELECT secrets FROM hookline.providers "
                       "WHERE name = 'sw') WHERE name = 'stripe'")
    loaded = await providers.load_all(pool)
    assert "stripe" not in loaded and loaded["sw"].signature.secrets == (SECRET,)


async def test_the_operator_claim_seals_adopts_by_the_opened_secret_and_rewrites_nothing_unchanged(
        pool: asyncpg.Pool) -> None:
    from hookline_operator.ownership import Resource
    from hookline_operator.reconcile import claim_row

    spec = {"signature": {"scheme": "standard-webhooks"}, "destination": {"url": "http://d/"}}
    ours = [{"value": SECRET, "notAfter": None}]
    # A row from before ownership was recorded, holding the resource's secret (sealed by the upgrade).
    async with pool.acquire() as conn:
        await providers.apply_providers(conn, PROVIDERS)
    await pool.execute("UPDATE hookline.providers SET managed_by = NULL WHERE name IN ('sw', 'stripe')")
    other = Resource("team-a", "stripe", "uid-stripe", 1)
    assert not (await claim_row(pool, other, spec, ours)).owned  # its secret is not the row's: not adopted
    resource = Resource("team-a", "sw", "uid-sw", 1)
    assert (await claim_row(pool, resource, spec, ours)).owned  # adopted: the opened secret matches
    row = await pool.fetchrow("SELECT xmin::text AS version, secrets FROM hookline.providers WHERE name = 'sw'")
    assert SECRET not in json.dumps(row["secrets"]) and row["secrets"][0]["value"].startswith("hl1:")
    again = await claim_row(pool, resource, spec, ours)
    assert again.owned
    assert await pool.fetchval("SELECT xmin::text FROM hookline.providers WHERE name = 'sw'") == row["version"]
    assert (await providers.load_all(pool))["sw"].signature.secrets == (SECRET,)


# -- rotation ---------------------------------------------------------------------------------------


async def test_rotate_key_rewraps_everything_online_and_then_the_old_key_can_go(pool: asyncpg.Pool,
                                                                                use_keys: object) -> None:
    old, new = secrets_at_rest.new_key_line(), secrets_at_rest.new_key_line()
    use_keys(old)  # type: ignore[operator]
    async with pool.acquire() as conn:
        await providers.apply_providers(conn, PROVIDERS)
        endpoint_secret = await endpoints.add(conn, "orders", "https://example.com/hook")
    before = await _raw_rows(pool)

    use_keys(new, old)  # type: ignore[operator]
    assert (await providers.load_all(pool))["sw"].signature.secrets == (SECRET,)  # readers keep working
    ring = secrets_at_rest.required_ring("test")
    async with pool.acquire() as conn:
        report = await stored_secrets.reseal_all(conn, ring, rewrap=True)
        assert (report.values, report.rewrapped, report.sealed) == (5, 5, 0)
        assert report.previous_keys == {KeyRing.from_keys([base64.b64decode(old)]).sealing_id: 5}
        assert "5 re-wrapped" in report.lines(ring)[0]
        again = await stored_secrets.reseal_all(conn, ring, rewrap=True)
        assert again.rewrapped == 0  # idempotent
    assert await _raw_rows(pool) != before

    use_keys(new)  # type: ignore[operator]
    loaded = await providers.load_all(pool)
    assert loaded["sw"].signature.secrets == (SECRET,) and loaded["stripe"].signature.secrets == (STRIPE,)
    assert [e.secrets for e in await endpoints.load(pool)] == [(endpoint_secret,)]

    # Without the key that wraps them the secrets do not open, and nothing is lost or changed.
    after = await _raw_rows(pool)
    use_keys(old)  # type: ignore[operator]
    assert await providers.load_all(pool) == {}
    assert await endpoints.load(pool) == []  # left out (and logged): its deliveries wait
    async with pool.acquire() as conn:
        with pytest.raises(SealedValueError):
            await stored_secrets.reseal_all(conn, secrets_at_rest.required_ring("test"), rewrap=True)
    assert await _raw_rows(pool) == after


def test_the_rotate_key_command_prints_counts(database_url: str, tmp_path: Path) -> None:
    old, new = secrets_at_rest.new_key_line(), secrets_at_rest.new_key_line()
    env = dict(os.environ)
    try:
        os.environ[secrets_at_rest.KEYS_FILE_ENV] = str(_keys_file(tmp_path / "old", old))
        assert hookline_cli(database_url, "providers", "apply", "-f", "-", stdin=PROVIDERS).returncode == 0
        os.environ[secrets_at_rest.KEYS_FILE_ENV] = str(_keys_file(tmp_path / "both", new, old))
        result = hookline_cli(database_url, "secrets", "rotate-key")
        assert result.returncode == 0, result.stderr
        assert "4 stored values; 0 plaintext sealed, 4 re-wrapped" in result.stdout
        assert "0 re-wrapped" in hookline_cli(database_url, "secrets", "rotate-key").stdout
        os.environ.pop(secrets_at_rest.KEYS_FILE_ENV)
        refused = hookline_cli(database_url, "secrets", "rotate-key")
        assert refused.returncode == 2 and "HOOKLINE_SECRET_KEYS_FILE" in refused.stderr
        assert old not in refused.stderr + result.stdout + result.stderr and new not in result.stdout
    finally:
        os.environ.clear()
        os.environ.update(env)


# -- the upgrade ------------------------------------------------------------------------------------


@pytest.fixture
async def old_database(pg_server: PgServer) -> AsyncIterator[str]:
    name = await pg_server.create_database(template=None)
    try:
        yield pg_server.url_for(name)
    finally:
        await pg_server.drop_database(name)


async def test_the_upgrade_encrypts_plaintext_in_place_only_with_a_key(old_database: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    conn = await db.connect(old_database)
    try:
        await migrations.migrate(conn, up_to=24)
        await conn.execute(
            "INSERT INTO hookline.providers (name, spec, secrets, destination_secret) VALUES "
            "('sw', $1::text::jsonb, $2::text::jsonb, 'whsec_ZGVzdGluYXRpb24tc2VjcmV0')",
            json.dumps({"signature": {"scheme": "standard-webhooks"}, "handler": "m:f"}),
            json.dumps([{"value": SECRET, "notAfter": None}, {"value": senders.SW_SECRET_2,
                                                               "notAfter": "2999-01-01T00:00:00+00:00"}]))
        await conn.execute("INSERT INTO hookline.endpoints (name, url, secrets) VALUES ('orders', 'https://e/', "
                           "jsonb_build_array(jsonb_build_object('value', 'whsec_ZW5kcG9pbnQtc2VjcmV0', "
                           "'notAfter', NULL)))")
        await migrations.migrate(conn)
        before = await _raw_rows(conn)

        # Without a key nothing changes, and the remaining plaintext is counted.
        key_file = os.environ.pop(secrets_at_rest.KEYS_FILE_ENV)
        try:
            lines = await stored_secrets.seal_plaintext(conn)
        finally:
            os.environ[secrets_at_rest.KEYS_FILE_ENV] = key_file
        assert lines == ["warning: 4 signing secrets are stored in plaintext: set HOOKLINE_SECRET_KEYS_FILE "
                         "and run `hookline migrate` again to encrypt them at rest"]
        assert await _raw_rows(conn) == before

        assert await stored_secrets.seal_plaintext(conn) == ["secrets: 4 plaintext values encrypted at rest"]
        raw = await _raw_rows(conn)
        for plaintext in (SECRET, senders.SW_SECRET_2, "ZGVzdGluYXRpb24tc2VjcmV0", "ZW5kcG9pbnQtc2VjcmV0"):
            assert plaintext not in raw
        assert "2999-01-01" in raw  # notAfter is no secret: it stays readable for rotation
        assert await stored_secrets.seal_plaintext(conn) == []  # idempotent
        assert await stored_secrets.count_plaintext(conn) == 0

        loaded = await providers.load_all(conn)
        assert loaded["sw"].signature.secrets == (SECRET, senders.SW_SECRET_2)
        stored = await conn.fetchval("SELECT destination_secret FROM hookline.providers WHERE name = 'sw'")
        assert providers.stored_destination_secret(secrets_at_rest.configured_ring(), "sw", stored) \
            == "whsec_ZGVzdGluYXRpb24tc2VjcmV0"
        assert [e.secrets for e in await endpoints.load(conn)] == [("whsec_ZW5kcG9pbnQtc2VjcmV0",)]
    finally:
        await conn.close()


def test_hookline_migrate_seals_and_says_so(old_database: str) -> None:
    import asyncio

    async def old_rows() -> None:
        conn = await asyncpg.connect(old_database)
        try:
            await migrations.migrate(conn, up_to=24)
            await conn.execute("INSERT INTO hookline.endpoints (name, url, secrets) VALUES ('orders', 'https://e/', "
                               "jsonb_build_array(jsonb_build_object('value', 'whsec_b2xk', 'notAfter', NULL)))")
        finally:
            await conn.close()

    asyncio.run(old_rows())
    result = hookline_cli(old_database, "migrate")
    assert result.returncode == 0, result.stderr
    assert "secrets: 1 plaintext values encrypted at rest" in result.stdout
    assert "secrets:" not in hookline_cli(old_database, "migrate").stdout


# -- the receiver, end to end --------------------------------------------------------------------


async def test_the_receiver_verifies_a_signed_request_with_the_secret_stored_encrypted(
        database_url: str, tmp_path: Path) -> None:
    assert hookline_cli(database_url, "providers", "apply", "-f", "-", stdin=PROVIDERS).returncode == 0
    conn = await asyncpg.connect(database_url)
    try:
        assert SECRET not in await _raw_rows(conn)
        service = receiver(database_url, tmp_path)
        try:
            body = json.dumps({"type": "t", "id": "x"}).encode()
            from datetime import UTC, datetime

            now = datetime.now(UTC)
            headers = {"webhook-id": "msg_encrypted", "webhook-timestamp": str(int(now.timestamp())),
                       "webhook-signature": Webhook(SECRET).sign("msg_encrypted", now, body.decode()),
                       "content-type": "application/json"}
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{service.url}/webhooks/sw", data=body, headers=headers) as answer:
                    assert (answer.status, await answer.json()) == (200, {"status": "accepted",
                                                                         "event_id": "msg_encrypted"})
                wrong = {**headers, "webhook-signature": Webhook(senders.SW_SECRET_2).sign(
                    "msg_encrypted", now, body.decode())}
                async with http.post(f"{service.url}/webhooks/sw", data=body, headers=wrong) as answer:
                    assert answer.status == 401
        finally:
            service.stop()
        logs = "".join(p.read_text() for p in tmp_path.glob("*") if p.is_file())
        assert SECRET not in logs and SECRET.removeprefix("whsec_") not in logs
    finally:
        await conn.close()


@pytest.mark.parametrize("command", [["receiver", "--port", "0"], ["relay", "--port", "0"]])
def test_a_service_that_reads_secrets_will_not_start_without_the_key(database_url: str, command: list[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(secrets_at_rest.KEYS_FILE_ENV)
    result = hookline_cli(database_url, *command)
    assert result.returncode == 2
    assert "needs the key that encrypts secrets at rest: set HOOKLINE_SECRET_KEYS_FILE" in result.stderr
