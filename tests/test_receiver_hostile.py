"""The receiver against hostile and broken senders, as a real process on a real Postgres.

A bad request must never cost a good event: whatever one sender sends, Postgres being up,
the answer is never a 5xx, and correctly signed events sent at the same moment are all
answered 200 and stored exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import gzip
import hashlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hookline.core import db
from hookline.receiver.group_commit import GroupCommitter, InboxRow
from support import senders
from support.postgres import PgServer, database_with_providers
from support.processes import ServiceProcess, hookline_cli, receiver

pytestmark = pytest.mark.asyncio(loop_scope="session")

# Short deadlines so that stalled clients are closed quickly in these tests; a keep-alive timeout
# far beyond any wait here, so that a closed connection proves the header or body deadline.
HEADER_TIMEOUT, BODY_TIMEOUT, KEEPALIVE_TIMEOUT = "1", "2", "600"


@pytest.fixture(scope="module")
async def module_db(pg_server: PgServer) -> AsyncIterator[str]:
    async with database_with_providers(pg_server, senders.PROVIDERS_YAML) as url:
        yield url


@pytest.fixture(scope="module")
def service(module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    proc = receiver(module_db, tmp_path_factory.mktemp("receiver-logs"), "--header-timeout", HEADER_TIMEOUT,
                    "--body-timeout", BODY_TIMEOUT, "--keepalive-timeout", KEEPALIVE_TIMEOUT)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
async def conn(module_db: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(module_db)
    yield c
    await c.close()


def new_id(prefix: str = "evt") -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


async def count(conn: asyncpg.Connection, provider: str, event_id: str) -> int:
    return int(await conn.fetchval(
        "SELECT count(*) FROM hookline.inbox WHERE provider = $1 AND event_id = $2", provider, event_id))


async def send(port: int, path: str, headers: dict[str, str] | list[tuple[bytes, bytes]], body: bytes,
               **options: bool) -> tuple[int | None, dict[str, object]]:
    pairs = [(k.encode(), v.encode()) for k, v in headers.items()] if isinstance(headers, dict) else headers
    if not any(name.lower() in (b"content-length", b"transfer-encoding") for name, _ in pairs):
        pairs = [*pairs, (b"Content-Length", str(len(body)).encode())]
    answer = await asyncio.to_thread(senders.raw_request, port, senders.request_head(path, pairs), body, **options)
    _, _, payload = answer.partition(b"\r\n\r\n")
    try:
        document = json.loads(payload)
    except ValueError:
        document = {}
    return senders.status_of(answer), document if isinstance(document, dict) else {}


class GoodTraffic:
    """Correctly signed events sent one after another while a test does something hostile."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[tuple[str, int, dict[str, object]]] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as http:
            while not self._stop.is_set():
                event_id = new_id("good")
                body = json.dumps({"type": "good.event", "data": {"n": len(self.answers)}}).encode()
                async with http.post(f"{self.url}/webhooks/sw", data=body,
                                     headers=senders.standard_webhooks(body, event_id)) as r:
                    self.answers.append((event_id, r.status, await r.json()))

    def __enter__(self) -> GoodTraffic:
        self._tasks = [asyncio.create_task(self._run()) for _ in range(3)]
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()

    async def finish(self, conn: asyncpg.Connection) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        assert len(self.answers) > 10
        bad = [(eid, status, answer) for eid, status, answer in self.answers
               if (status, answer) != (200, {"status": "accepted", "event_id": eid})]
        assert not bad, bad[:5]
        stored = await conn.fetch("SELECT event_id, count(*) AS n FROM hookline.inbox "
                                  "WHERE provider = 'sw' AND event_id = ANY($1::text[]) GROUP BY event_id",
                                  [eid for eid, _, _ in self.answers])
        assert {r["event_id"]: r["n"] for r in stored} == {eid: 1 for eid, _, _ in self.answers}


# --- one case each ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event_id", "error"),
    [
        ("evt\x00nul", "invalid_event_id"),
        ("evt\r\nX-Injected: 1", "invalid_event_id"),
        ("evt\x7f", "invalid_event_id"),
        ("e" * 257, "invalid_event_id"),
        ("é" * 5000, "invalid_event_id"),
    ],
)
async def test_event_ids_that_cannot_be_stored_or_sent_on_are_400(event_id: str, error: str,
                                                                   service: ServiceProcess) -> None:
    body = json.dumps({"id": event_id, "type": "t"}).encode()
    status, answer = await send(service.port, "/webhooks/open", {}, body)
    assert (status, answer.get("error")) == (400, error)


async def test_event_id_of_256_characters_is_accepted(service: ServiceProcess, conn: asyncpg.Connection) -> None:
    event_id = "é" * 200 + uuid.uuid4().hex + "x" * 24
    assert len(event_id) == 256
    body = json.dumps({"id": event_id}).encode()
    status, answer = await send(service.port, "/webhooks/open", {"Content-Type": "application/json"}, body)
    assert (status, answer) == (200, {"status": "accepted", "event_id": event_id})
    assert await count(conn, "open", event_id) == 1


async def test_nul_in_event_type_or_entity_key_is_400_invalid_event(service: ServiceProcess) -> None:
    nul_type = {"id": new_id(), "type": "a\u0000b"}
    lone_surrogate_key = {"id": new_id(), "type": "t", "data": {"object": {"id": "\ud800"}}}
    for doc in (nul_type, lone_surrogate_key):
        body = json.dumps(doc).encode()
        status, answer = await send(service.port, "/webhooks/stripe", senders.stripe_raw(body), body)
        assert (status, answer.get("error")) == (400, "invalid_event"), doc


async def test_deep_json_is_400_invalid_json(service: ServiceProcess) -> None:
    body = b"[" * 200_000 + b"]" * 200_000
    status, answer = await send(service.port, "/webhooks/open", {}, body)
    assert (status, answer.get("error")) == (400, "invalid_json")


async def test_header_bytes_that_are_not_utf8_are_stored_escaped(service: ServiceProcess,
                                                                   conn: asyncpg.Connection) -> None:
    delivery = new_id("gh")
    body = b'{"zen": "bytes"}'
    headers = [(k.encode(), v.encode()) for k, v in senders.github(body, delivery).items()]
    headers += [(b"X-Latin1", b"caf\xe9"), (b"X-Mixed", b"ok \xff\xfe end")]
    status, answer = await send(service.port, "/webhooks/github", headers, body)
    assert (status, answer) == (200, {"status": "accepted", "event_id": delivery})
    stored = await conn.fetchval("SELECT headers FROM hookline.inbox WHERE provider = 'github' AND event_id = $1",
                                 delivery)
    stored = json.loads(stored) if isinstance(stored, str) else stored
    assert stored["X-Latin1"] == "caf\\xe9"
    assert stored["X-Mixed"] == "ok \\xff\\xfe end"


async def test_gzip_body_is_verified_and_stored_decoded(service: ServiceProcess, conn: asyncpg.Connection) -> None:
    delivery = new_id("gh")
    body = json.dumps({"zen": "compressed " * 50}).encode()
    headers = {**senders.github(body, delivery), "Content-Encoding": "gzip"}
    status, answer = await send(service.port, "/webhooks/github", headers, gzip.compress(body))
    assert (status, answer) == (200, {"status": "accepted", "event_id": delivery})
    row = await conn.fetchrow("SELECT body, headers FROM hookline.inbox WHERE provider = 'github' AND event_id = $1",
                              delivery)
    assert row["body"] == body
    assert "Content-Encoding" not in (json.loads(row["headers"]) if isinstance(row["headers"], str) else row["headers"])


@pytest.mark.parametrize(
    ("encoding", "payload"),
    [("gzip", b"not gzip at all"), ("gzip", gzip.compress(b'{"id": "x"}')[:-6]), ("br", b"\x0b\x02\x80{}\x03"),
     ("gzip, gzip, gzip", b"{}"), ("x-unknown", b"{}")],
)
async def test_bad_or_unsupported_content_encoding_is_400(encoding: str, payload: bytes,
                                                          service: ServiceProcess) -> None:
    status, answer = await send(service.port, "/webhooks/open", {"Content-Encoding": encoding}, payload)
    assert (status, answer.get("error")) == (400, "invalid_body")


async def test_gzip_bomb_is_413_without_inflating_it(service: ServiceProcess) -> None:
    bomb = gzip.compress(b"{" + b" " * (64 * 1024 * 1024))  # 64 MiB of spaces in ~64 kB
    status, answer = await send(service.port, "/webhooks/stripe", {"Content-Encoding": "gzip"}, bomb)
    assert (status, answer.get("error")) == (413, "payload_too_large")


async def test_malformed_chunked_body_is_400(service: ServiceProcess) -> None:
    headers = [(b"Transfer-Encoding", b"chunked")]
    status, _ = await send(service.port, "/webhooks/open", headers, b"5\r\n{}{}{\r\nZZ\r\nnope\r\n0\r\n\r\n")
    assert status == 400


async def test_client_gone_mid_body_is_one_quiet_line(service: ServiceProcess) -> None:
    headers = [(b"Content-Length", b"1000")]
    status, _ = await send(service.port, "/webhooks/open", headers, b'{"id": "gone', half_close=True)
    assert status is None  # nobody left to answer
    for _ in range(200):
        if "client closed the connection before sending its whole body" in service.logs():
            break
        await asyncio.sleep(0.05)
    logs = service.logs()
    assert "client closed the connection before sending its whole body" in logs
    assert "Traceback" not in logs


# --- replays the signature does not cover ----------------------------------------------------------


async def test_replayed_body_with_a_new_delivery_id_is_a_duplicate(service: ServiceProcess,
                                                                    conn: asyncpg.Connection) -> None:
    body = json.dumps({"action": "opened", "nonce": uuid.uuid4().hex}).encode()
    first = new_id("gh")
    status, answer = await send(service.port, "/webhooks/github-replay", senders.github(body, first), body)
    assert (status, answer) == (200, {"status": "accepted", "event_id": first})
    replays = [new_id("gh") for _ in range(8)]
    answers = await asyncio.gather(*(send(service.port, "/webhooks/github-replay", senders.github(body, r), body)
                                     for r in replays))
    assert answers == [(200, {"status": "duplicate", "event_id": first})] * len(replays)
    assert await conn.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider = 'github-replay' "
                               "AND body = $1", body) == 1
    # The same body on a provider without replayProtection is a new event, as before.
    other = new_id("gh")
    status, answer = await send(service.port, "/webhooks/github", senders.github(body, other), body)
    assert (status, answer) == (200, {"status": "accepted", "event_id": other})


async def test_concurrent_replays_store_the_body_once(service: ServiceProcess, conn: asyncpg.Connection) -> None:
    body = json.dumps({"action": "closed", "nonce": uuid.uuid4().hex}).encode()
    ids = [new_id("gh") for _ in range(12)]
    answers = await asyncio.gather(*(send(service.port, "/webhooks/github-replay", senders.github(body, i), body)
                                     for i in ids))
    accepted = [a["event_id"] for s, a in answers if a.get("status") == "accepted"]
    assert len(accepted) == 1
    assert all(s == 200 and a["event_id"] == accepted[0] for s, a in answers)
    assert await conn.fetchval("SELECT count(*) FROM hookline.inbox WHERE provider = 'github-replay' "
                               "AND body = $1", body) == 1


# --- no collateral damage -------------------------------------------------------------------------


async def test_a_row_postgres_refuses_fails_alone_in_its_batch(database_url: str) -> None:
    """The group committer bisects a batch that fails for a reason in the data."""
    pool = await db.create_pool(database_url, max_size=4)
    # One writer and a long window: every row below lands in the same first batch.
    committer = GroupCommitter(pool, max_batch=64, window=0.3, flushers=1)
    committer.start()
    try:
        def row(event_id: str) -> InboxRow:
            return InboxRow("open", event_id, None, None, {}, b"{}", None)

        good = [new_id() for _ in range(20)]
        bad = ["bad\x00nul", os.urandom(6000).hex()]  # NUL; past the btree entry limit (incompressible)
        rows = [row(i) for i in good[:10]] + [row(bad[0])] + [row(i) for i in good[10:]] + [row(bad[1])]
        results = await asyncio.gather(*(committer.store(r) for r in rows), return_exceptions=True)
        by_id = {r.event_id: result for r, result in zip(rows, results, strict=True)}
        for event_id in good:
            assert getattr(by_id[event_id], "is_new", None) is True, by_id[event_id]
        assert isinstance(by_id[bad[0]], asyncpg.DataError)
        assert isinstance(by_id[bad[1]], asyncpg.ProgramLimitExceededError)
        assert await pool.fetchval("SELECT count(*) FROM hookline.inbox WHERE event_id = ANY($1::text[])",
                                   good) == len(good)
    finally:
        await committer.stop()
        await pool.close()


async def test_refused_rows_get_400_and_their_batch_mates_200_over_http(database_url: str, log_dir: Path) -> None:
    assert hookline_cli(database_url, "providers", "apply", "-f", "-", stdin=senders.PROVIDERS_YAML).returncode == 0
    c = await asyncpg.connect(database_url)
    # A constraint stands in for any row Postgres refuses that validation let through.
    await c.execute("ALTER TABLE hookline.inbox ADD CONSTRAINT no_poison CHECK (event_type <> 'poison')")
    proc = receiver(database_url, log_dir, "--batch-window-ms", "50", "--db-connections", "1")
    try:
        docs = [{"id": new_id(), "type": "poison" if i % 7 == 3 else "fine"} for i in range(40)]
        answers = await asyncio.gather(*(send(proc.port, "/webhooks/open", {}, json.dumps(d).encode())
                                         for d in docs))
        for doc, (status, answer) in zip(docs, answers, strict=True):
            if doc["type"] == "poison":
                assert (status, answer.get("error")) == (400, "invalid_event")
            else:
                assert (status, answer) == (200, {"status": "accepted", "event_id": doc["id"]})
        stored = {r["event_id"] for r in await c.fetch("SELECT event_id FROM hookline.inbox")}
        assert stored == {d["id"] for d in docs if d["type"] == "fine"}
    finally:
        proc.stop()
        await c.close()


# --- bounded resources ----------------------------------------------------------------------------


async def _stall(port: int, head: bytes, trickle: bytes) -> bool:
    """Send ``head``, then a byte of ``trickle`` every 0.2 s; True once the server closes on us."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        closed = asyncio.create_task(reader.read())
        for byte in trickle:
            if closed.done():
                break
            writer.write(bytes([byte]))
            try:
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.wait({closed}, timeout=0.2)
        answer = await asyncio.wait_for(closed, 300)  # EOF (b"" or a final answer) means closed
        return answer == b"" or answer.startswith(b"HTTP/1.1 408")
    except ConnectionError:
        return True
    finally:
        writer.close()


async def test_stalled_clients_are_closed_while_good_events_flow(service: ServiceProcess,
                                                                 conn: asyncpg.Connection) -> None:
    slow_headers = b"POST /webhooks/open HTTP/1.1\r\nHost: x\r\nX-Slow: "
    slow_body = b"POST /webhooks/open HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{"
    with GoodTraffic(service.url) as good:
        # Header and body bytes keep trickling (for ~30 minutes): only the deadlines can close these.
        stalled = [_stall(service.port, slow_headers, b"a" * 10_000) for _ in range(40)]
        stalled += [_stall(service.port, slow_body, b" " * 10_000) for _ in range(40)]
        stalled += [_stall(service.port, slow_headers, b"") for _ in range(10)]  # half the headers, then nothing
        stalled += [_stall(service.port, slow_body, b"") for _ in range(10)]  # headers, then no more body
        closed = await asyncio.gather(*stalled)
        await good.finish(conn)
    assert all(closed)
    async with aiohttp.ClientSession() as http, http.get(f"{service.url}/metrics") as r:
        text = await r.text()
    timed_out = next(float(line.split()[1]) for line in text.splitlines()
                     if line.startswith("hookline_http_connections_timed_out_total"))
    assert timed_out >= 50  # the 50 whose headers never completed


async def test_idle_connections_are_closed_after_the_keepalive_timeout(database_url: str, log_dir: Path) -> None:
    proc = receiver(database_url, log_dir, "--keepalive-timeout", "1")
    try:
        async def used_then_idle() -> bool:
            reader, writer = await asyncio.open_connection("127.0.0.1", proc.port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive by default in HTTP/1.1
            answer = await asyncio.wait_for(reader.read(), 300)  # everything until the server closes
            writer.close()
            return answer.startswith(b"HTTP/1.1 200")

        never_used = [_stall(proc.port, b"", b"") for _ in range(10)]
        results = await asyncio.gather(*never_used, *(used_then_idle() for _ in range(10)))
        assert all(results)
    finally:
        proc.stop()


async def test_buffer_cap_answers_503_with_retry_after(database_url: str, log_dir: Path) -> None:
    assert hookline_cli(database_url, "providers", "apply", "-f", "-", stdin=senders.PROVIDERS_YAML).returncode == 0
    proc = receiver(database_url, log_dir, "--max-buffered-bodies", "3", "--body-timeout", "60")
    holders = []
    try:
        for _ in range(3):  # three requests that hold a body slot: headers and half a body
            reader, writer = await asyncio.open_connection("127.0.0.1", proc.port)
            writer.write(b"POST /webhooks/open HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"id\": ")
            await writer.drain()
            holders.append((reader, writer))
        async with aiohttp.ClientSession() as http:
            # Wait until the server has parsed the holders' headers and given each a slot. Probing with
            # POSTs instead raced them: a probe stored while the last holder came in held the third
            # slot, that holder was refused, and every later probe found a free slot.
            for _ in range(200):
                async with http.get(f"{proc.url}/metrics") as r:
                    metrics_text = await r.text()
                if "hookline_receiver_buffered_bodies 3.0" in metrics_text:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the three holders never held a body slot each: "
                            + "".join(line for line in metrics_text.splitlines(True) if "buffered" in line))
            async with http.post(f"{proc.url}/webhooks/open", data=json.dumps({"id": new_id()}).encode()) as r:
                assert r.status == 503
                assert r.headers["Retry-After"]
                assert (await r.json())["error"] == "unavailable"
            async with http.get(f"{proc.url}/metrics") as r:  # the refusal took no slot and gave none back
                assert "hookline_receiver_buffered_bodies 3.0" in await r.text()
            for _, writer in holders:
                writer.close()
            fresh = json.dumps({"id": new_id()}).encode()
            for _ in range(100):  # slots come back as the server notices the closed connections
                async with http.post(f"{proc.url}/webhooks/open", data=fresh) as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.05)
            assert r.status == 200
    finally:
        for _, writer in holders:
            writer.close()
        proc.stop()


async def test_full_commit_queue_answers_503_at_once(database_url: str, log_dir: Path) -> None:
    assert hookline_cli(database_url, "providers", "apply", "-f", "-", stdin=senders.PROVIDERS_YAML).returncode == 0
    proc = receiver(database_url, log_dir, "--max-queued-events", "1", "--db-connections", "1", "--max-batch", "1")
    locker = await asyncpg.connect(database_url)
    try:
        tx = locker.transaction()
        await tx.start()
        await locker.execute("LOCK TABLE hookline.inbox IN SHARE MODE")  # inserts wait: Postgres is "slow"
        docs = [{"id": new_id()} for _ in range(6)]
        pending = [asyncio.create_task(send(proc.port, "/webhooks/open", {}, json.dumps(d).encode())) for d in docs]
        done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED, timeout=60)
        assert done, "nothing was refused while the queue was full"
        assert all(t.result()[0] == 503 and t.result()[1].get("error") == "unavailable" for t in done)
        await tx.rollback()
        answers = [await t for t in pending]
        accepted = [d["id"] for d, (status, _) in zip(docs, answers, strict=True) if status == 200]
        refused = [status for status, _ in answers if status == 503]
        assert accepted and refused and len(accepted) + len(refused) == len(docs)
        stored = {r["event_id"] for r in await locker.fetch("SELECT event_id FROM hookline.inbox")}
        assert stored == set(accepted)
    finally:
        await locker.close()
        proc.stop()


# --- property-based: whatever arrives, never a 5xx, never a good event lost ----------------------------

TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", min_size=1,
                max_size=20)
# Mostly what HTTP allows in a value (visible ASCII and any byte >= 0x80: not necessarily UTF-8),
# sometimes any byte but CR/LF.
_FIELD_BYTES = [9, *range(0x20, 0x7F), *range(0x80, 0x100)]
HEADER_VALUE = st.one_of(
    st.lists(st.sampled_from(_FIELD_BYTES), max_size=200).map(bytes),
    st.lists(st.sampled_from(_FIELD_BYTES), max_size=200).map(bytes),
    st.binary(max_size=200).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
)
HEADER_NAME = TOKEN.map(str.encode)


@st.composite
def json_body(draw: st.DrawFn) -> bytes:
    # Half the ids are fine, so that hostile headers, types and keys reach the database too.
    fine = not draw(st.booleans())
    event_id = new_id() if fine else draw(st.one_of(st.text(max_size=300), st.integers(), st.none()))
    doc = {"id": event_id, "type": draw(st.one_of(st.text(max_size=50), st.none())),
           "data": {"object": {"id": draw(st.one_of(st.text(max_size=50), st.integers()))}},
           "pad": draw(st.text(max_size=2000))}
    depth = draw(st.sampled_from([0, 0, 10, 1000, 100_000]))
    text = json.dumps(doc, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    return b"[" * depth + text + b"]" * depth


@st.composite
def hostile_request(draw: st.DrawFn) -> tuple[bytes, bytes, bool]:
    provider = draw(st.sampled_from(["open", "open", "open", "stripe", "stripe", "github", "github-replay",
                                     "sw", "nobody"]))
    body = draw(st.one_of(json_body(), json_body(), st.binary(max_size=5000)))
    headers: list[tuple[bytes, bytes]] = draw(st.lists(st.tuples(HEADER_NAME, HEADER_VALUE), max_size=6))
    # Hypothesis favours the simplest draw (0, False): let that be the well-formed choice.
    if draw(st.integers(0, 9)) == 9:  # now and then a name that is not a token: the parser's turn
        headers.append((draw(st.binary(min_size=1, max_size=20)), b"x"))
    if provider == "stripe" and draw(st.integers(0, 3)) != 3:
        headers += [(k.encode(), v.encode()) for k, v in senders.stripe_raw(body).items()]
    if provider.startswith("github"):
        delivery = draw(st.one_of(st.just(new_id("gh").encode()), HEADER_VALUE))
        headers += [(b"X-GitHub-Delivery", delivery), (b"X-GitHub-Event", draw(HEADER_VALUE))]
        if draw(st.integers(0, 3)) != 3:
            headers += [(k.encode(), v.encode()) for k, v in senders.github(body, "x").items()
                        if k == "X-Hub-Signature-256"]
    encoding = draw(st.sampled_from([None, None, None, None, "gzip", "gzip", "bogus", "deflate", "gzip-lie"]))
    wire = body
    if encoding == "gzip":
        wire = gzip.compress(body)
    if encoding is not None:
        headers.append((b"Content-Encoding", b"gzip" if encoding == "gzip-lie" else encoding.encode()))
    framing = draw(st.sampled_from(["length"] * 5 + ["chunked", "chunked", "bad-chunked", "short-length",
                                                     "long-length"]))
    half_close = False
    if framing == "chunked":
        headers.append((b"Transfer-Encoding", b"chunked"))
        wire = (f"{len(wire):x}\r\n".encode() + wire + b"\r\n0\r\n\r\n") if wire else b"0\r\n\r\n"
    elif framing == "bad-chunked":
        headers.append((b"Transfer-Encoding", b"chunked"))
        wire = f"{len(wire) + 7:x}\r\n".encode() + wire + b"\r\nzz\r\n"
        half_close = True
    elif framing == "short-length":
        headers.append((b"Content-Length", str(max(len(wire) // 2, 0)).encode()))
    elif framing == "long-length":
        headers.append((b"Content-Length", str(len(wire) + 100).encode()))
        half_close = True
    else:
        headers.append((b"Content-Length", str(len(wire)).encode()))
    return senders.request_head(f"/webhooks/{provider}", headers), wire, half_close


async def test_fuzz_never_5xx_and_good_events_unharmed(service: ServiceProcess, conn: asyncpg.Connection) -> None:
    answers: list[int | None] = []
    codes: list[str] = []

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(hostile_request())
    def fuzz(request: tuple[bytes, bytes, bool]) -> None:
        head, wire, half_close = request
        answer = senders.raw_request(service.port, head, wire, half_close=half_close, timeout=30)
        status = senders.status_of(answer)
        answers.append(status)
        codes.append(answer.partition(b'"error": "')[2].partition(b'"')[0].decode())
        assert status is None or status < 500, (head, wire[:200], answer[:300])

    with GoodTraffic(service.url) as good:
        await asyncio.to_thread(fuzz)
        await good.finish(conn)
    assert len(answers) >= 300
    # The examples reach every layer: parser, signature, validation, and the database.
    assert answers.count(200) >= 10, collections.Counter(answers)
    assert {"invalid_signature", "invalid_json", "invalid_body"} <= set(codes), collections.Counter(codes)
    assert "Traceback" not in service.logs()


async def test_body_hash_is_sha256_of_the_decoded_body() -> None:
    from multidict import CIMultiDict

    from hookline.core.providers import parse_provider
    from hookline.receiver.intake import build_row

    provider = parse_provider("gh", {"signature": {"scheme": "github"}, "handler": "m:f",
                                     "replayProtection": {"bodyHashWindowSeconds": 60}}, ["s"])
    row = build_row(provider, CIMultiDict({"X-GitHub-Delivery": "d1"}), b"{}", None)
    assert (row.body_sha256, row.replay_window_seconds) == (hashlib.sha256(b"{}").digest(), 60)


@pytest.mark.parametrize("replay", [{}, {"bodyHashWindowSeconds": 0}, {"bodyHashWindowSeconds": True}, 3600])
async def test_replay_protection_spec_errors_name_the_field(replay: object) -> None:
    from hookline.core.providers import SpecError, parse_provider

    with pytest.raises(SpecError, match="replayProtection"):
        parse_provider("gh", {"signature": {"scheme": "github"}, "handler": "m:f", "replayProtection": replay},
                       ["secret"])



@pytest.mark.parametrize("failure", [
    # What asyncpg raised for a statement sent on a connection the server had just ended (make test, 2026-12-01).
    asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
    asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    ConnectionResetError(104, "Connection reset by peer"),
    TimeoutError(),
])
async def test_a_batch_lost_with_its_connection_is_answered_503_retry_later(failure: BaseException) -> None:
    from hookline.core.providers import parse_provider
    from hookline.receiver.intake import Intake

    provider = parse_provider("gh", {"signature": {"scheme": "github"}, "handler": "m:f"}, ["s"])
    response = Intake._stored_answer(provider, failure)
    assert (response.status, json.loads(response.text or "")["error"]) == (503, "unavailable")
    assert response.headers["Retry-After"]
    with pytest.raises(RuntimeError):  # a fault of ours is not passed off as Postgres being away
        Intake._stored_answer(provider, RuntimeError("a bug"))
