"""What the console reads and replays, for one request's ``Access`` at a time.

Every read runs in ``Store.scoped(access)``: one transaction that switches to this database's
NOLOGIN console role (migration 0029) and names the request's providers in the settings its
row-level security policies read, with a statement timeout. So a list that forgot a filter, or
any SQL in that transaction, sees only those providers (and the outbox only when the Access is
install-wide). Replays check ``Access.replay`` first, select what they replay through the same
policies, then write as the owner and record who replayed what in the attempt log.

Every method returns plain JSON-able dicts (times as ISO 8601 strings): the JSON API and the
pages render the same values.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from hookline import outbox
from hookline.console.access import Access
from hookline.core import db
from hookline.core.history import redact_headers
from hookline.core.inbox_stats import NO_EVENTS, provider_stats
from hookline.core.queue import INBOX, OUTBOX, Queue

SQL = "console.sql"
MAX_LIMIT = 200
DEFAULT_LIMIT = 50
MAX_QUERY_CHARS = 200  # the event-id substring search
MAX_FILTER_CHARS = 1000  # an event type or entity key
MAX_BODY_BYTES = 1024 * 1024  # shown whole below this; above, the first MAX_BODY_BYTES and a flag
MAX_REPLAY = 10_000  # events (or deliveries) one replay requeues at most
MAX_IDS = 1000  # ids named in one replay
RECENT_SECONDS = 300.0
OLDEST_DUE_PROBLEM_SECONDS = 300.0
EVENT_STATUSES = ("pending", "processing", "done", "dead")
DELIVERY_STATUSES = ("pending", "processing", "done", "dead", "parked")
TEST_EVENT_TYPE = "hookline.test"


class BadRequest(ValueError):
    """A filter, cursor or body the store refuses; ``field`` names what was wrong (400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class NotFound(LookupError):
    """Nothing of that name the Access may read (404: whether it exists is not told)."""


class Forbidden(PermissionError):
    """The Access may read it but not replay it (403)."""


@dataclass(frozen=True)
class EventFilter:
    """The event lists' filters; every one optional. ``parse`` checks what came from a request."""

    provider: str | None = None
    status: str | None = None
    type: str | None = None
    entity: str | None = None
    received_after: datetime | None = None
    received_before: datetime | None = None
    q: str | None = None

    @classmethod
    def parse(cls, values: dict[str, str], *, statuses: Sequence[str] = EVENT_STATUSES) -> EventFilter:
        """From query parameters (or a replay's ``filter`` object): each value a string."""
        for name in ("provider", "type", "entity"):
            if len(values.get(name) or "") > MAX_FILTER_CHARS:
                raise BadRequest(name, f"{name} is longer than {MAX_FILTER_CHARS} characters")
        status = values.get("status") or None
        if status is not None and status not in statuses:
            raise BadRequest("status", f"status must be one of {', '.join(statuses)}")
        q = values.get("q") or None
        if q is not None and len(q) > MAX_QUERY_CHARS:
            raise BadRequest("q", f"q (a substring of the event id) is longer than {MAX_QUERY_CHARS} characters")
        after, before = (_time(values, "received_after"), _time(values, "received_before"))
        if after is not None and before is not None and after > before:
            raise BadRequest("received_after", "received_after is later than received_before")
        return cls(provider=values.get("provider") or None, status=status, type=values.get("type") or None,
                   entity=values.get("entity") or None, received_after=after, received_before=before, q=q)


def parse_limit(text: str | None) -> int:
    if text is None or text == "":
        return DEFAULT_LIMIT
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise BadRequest("limit", f"limit must be a whole number from 1 to {MAX_LIMIT}")
    return int(text)


def encode_cursor(*key: Any) -> str:
    """An opaque cursor: the last row's sort key (times as ISO strings), base64 of JSON."""
    plain = [k.isoformat() if isinstance(k, datetime) else k for k in key]
    return base64.urlsafe_b64encode(json.dumps(plain).encode()).decode().rstrip("=")


def _decode_cursor(text: str, shape: tuple[type, ...]) -> list[Any]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if not isinstance(raw, list) or len(raw) != len(shape):
            raise ValueError("wrong shape")
        values: list[Any] = []
        for value, kind in zip(raw, shape, strict=True):
            if kind is datetime:
                values.append(datetime.fromisoformat(value))
            elif kind is int and isinstance(value, int) and not isinstance(value, bool):
                values.append(value)
            else:
                raise ValueError("wrong type")
        return values
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise BadRequest("cursor", "cursor is not one this API returned (give next_cursor unchanged)") from None


def _time(values: dict[str, str], name: str) -> datetime | None:
    text = values.get(name) or None
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest(name, f"{name} must be an ISO 8601 time with a zone, e.g. 2026-01-31T12:00:00Z") from None
    if when.tzinfo is None:
        raise BadRequest(name, f"{name} must say its time zone (e.g. a trailing Z for UTC)")
    return when


def plain(value: Any) -> Any:
    """A column value as JSON has it."""
    return value.isoformat() if isinstance(value, datetime) else value


# Called after every replay that requeued something, from the API or the pages (console/service.py
# records a Kubernetes Event): (access, {"providers": {name: count}} or {"endpoints": {name: count}}).
ReplayHook = Callable[[Access, dict[str, dict[str, int]]], Awaitable[None]]


class Store:
    """The console's reads and replays on the owner's pool; ``statement_timeout`` in seconds."""

    def __init__(self, pool: asyncpg.Pool, *, statement_timeout: float = 5.0) -> None:
        self.pool = pool
        self.statement_timeout = statement_timeout
        self.replay_hooks: list[ReplayHook] = []

    @contextlib.asynccontextmanager
    async def scoped(self, access: Access) -> AsyncIterator[asyncpg.Connection]:
        """One transaction reading as the console role, limited to what ``access`` may read."""
        providers = "*" if access.read is None else json.dumps(sorted(access.read))
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(db.query("scope", SQL), providers, "on" if access.install_wide else "off",
                               f"{int(self.statement_timeout * 1000)}ms", json.dumps(sorted(access.endpoints)),
                               json.dumps(sorted(access.namespaces)))
            yield conn

    # -- providers -------------------------------------------------------------------------------

    async def provider_owners(self) -> list[tuple[str, str | None, str | None, str | None]]:
        """(name, owner_namespace, owner_name, owner_uid) of every provider, for the authorizer."""
        rows = await self.pool.fetch(db.query("provider_owners", SQL))
        return [(r["name"], r["owner_namespace"], r["owner_name"], r["owner_uid"]) for r in rows]

    async def endpoint_owners(self) -> list[tuple[str, str, str, str | None]]:
        """(name, namespace, resource name, owner uid) of every WebhookEndpoint's endpoint, for the
        authorizer and the Events of replays."""
        rows = await self.pool.fetch(db.query("endpoint_owners", SQL))
        return [(r["name"], r["namespace"], r["resource_name"], r["owner_uid"]) for r in rows]

    async def providers(self, access: Access, only: str | None = None) -> list[dict[str, Any]]:
        """The providers the Access may read, with their queues' state and what is wrong."""
        async with self.scoped(access) as conn:
            rows = await conn.fetch(db.query("providers", SQL), None if only is None else [only])
            stats = await provider_stats(conn)
            names = [r["name"] for r in rows]
            recent = {r["provider"]: r for r in await conn.fetch(db.query("recent_inbox_activity", "status.sql"),
                                                                  RECENT_SECONDS, names)}
            problems = {r["provider"]: r for r in await conn.fetch(db.query("handler_problems", "status.sql"))}
        found = []
        for r in rows:
            q = stats.get(r["name"], NO_EVENTS)
            h = problems.get(r["name"])
            conditions = []
            if h is not None:
                conditions.append({"type": "HandlerImportable", "status": False,
                                   "message": f"handler {h['handler']} cannot be imported: {h['problem']}"})
            if q.dead:
                conditions.append({"type": "NoDeadLetters", "status": False, "message": f"{q.dead} dead events"})
            if q.oldest_due_seconds > OLDEST_DUE_PROBLEM_SECONDS:
                conditions.append({"type": "Draining", "status": False,
                                   "message": f"oldest due event waiting {q.oldest_due_seconds:.0f} s"})
            a = recent.get(r["name"])
            found.append({
                "name": r["name"], "managed_by": r["managed_by"], "owner_namespace": r["owner_namespace"],
                "owner_name": r["owner_name"], "updated_at": plain(r["updated_at"]),
                "signature_scheme": r["signature_scheme"], "handler": r["handler"],
                "backlog": q.backlog, "due": q.due, "retrying": q.retrying, "deferred": q.deferred,
                "processing": q.in_flight, "dead": q.dead, "oldest_due_seconds": round(q.oldest_due_seconds, 3),
                "accepted_recently": int(a["accepted"]) if a else 0, "failed_recently": int(a["failed"]) if a else 0,
                "recent_seconds": RECENT_SECONDS, "healthy": not conditions, "conditions": conditions,
            })
        return found

    async def provider(self, access: Access, name: str) -> dict[str, Any]:
        if not access.may_read(name):
            raise NotFound(f"no provider {name!r}")
        found = await self.providers(access, only=name)
        if not found:
            raise NotFound(f"no provider {name!r}")
        return found[0]

    # -- events ----------------------------------------------------------------------------------

    async def events(self, access: Access, filters: EventFilter, limit: int = DEFAULT_LIMIT,
                     cursor: str | None = None, *, dead_only: bool = False) -> tuple[list[dict[str, Any]], str | None]:
        """One page of events, newest first, and the cursor of the next page (None: the last)."""
        if not 1 <= limit <= MAX_LIMIT:
            raise BadRequest("limit", f"limit must be from 1 to {MAX_LIMIT}")
        after_at, after_id = _decode_cursor(cursor, (datetime, int)) if cursor else (None, None)
        if filters.provider is not None and not access.may_read(filters.provider):
            return [], None
        async with self.scoped(access) as conn:
            names = [filters.provider] if filters.provider else [
                r["name"] for r in await conn.fetch(db.query("providers", SQL), None)]
            rows = await conn.fetch(db.query("events_page", SQL, dead=dead_only), names, filters.status, filters.type,
                                    filters.entity, filters.received_after, filters.received_before, filters.q,
                                    after_at, after_id, limit + 1)
        items = [{k: plain(v) for k, v in r.items()} for r in rows[:limit]]
        more = len(rows) > limit
        last = rows[limit - 1] if more else None
        return items, encode_cursor(last["received_at"], last["id"]) if last is not None else None

    async def dead_letters(self, access: Access, filters: EventFilter, limit: int = DEFAULT_LIMIT,
                           cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        return await self.events(access, dataclasses.replace(filters, status=None), limit, cursor,
                                 dead_only=True)

    async def event(self, access: Access, provider: str, event_id: str) -> dict[str, Any]:
        """One event: redacted headers, its body (and the JSON parsed when it parses), every attempt."""
        if not access.may_read(provider):
            raise NotFound(f"no event {event_id!r} of provider {provider!r}")
        async with self.scoped(access) as conn:
            row = await conn.fetchrow(db.query("event", SQL), provider, event_id, MAX_BODY_BYTES)
            if row is None:
                raise NotFound(f"no event {event_id!r} of provider {provider!r}")
            attempts = await conn.fetch(db.query("attempts", SQL), "inbox", row["id"], row["received_at"])
        return {
            **{k: plain(row[k]) for k in ("id", "provider", "event_id", "event_type", "entity_key", "status",
                                          "attempts", "received_at", "next_attempt_at", "processed_at",
                                          "locked_by", "lease_expires_at", "last_error", "deferred_since",
                                          "suspect", "content_type", "body_bytes")},
            "headers": redact_headers(row["headers"] or {}),
            **_body(bytes(row["body"]), row["body_bytes"]),
            "attempt_log": [_attempt(a) for a in attempts],
        }

    # -- replays ---------------------------------------------------------------------------------

    async def replay(self, access: Access, *, provider: str | None = None, ids: Sequence[str] | None = None,
                     filters: EventFilter | None = None, dry_run: bool = False) -> dict[str, Any]:
        """Requeue dead events: those of ``provider`` named by event id in ``ids``, or every dead event
        matching ``filters`` (its ``provider`` or every provider the Access may replay). Returns the
        count (would be, for a dry run) and whether more matched than one replay requeues."""
        if ids is not None and provider is None:
            raise BadRequest("provider", "name the provider of the event ids")
        if ids is not None and not 1 <= len(ids) <= MAX_IDS:
            raise BadRequest("ids", f"give from 1 to {MAX_IDS} event ids")
        named = provider or (filters.provider if filters else None)
        if named is not None:
            if not access.may_read(named):
                raise NotFound(f"no provider {named!r}")
            if not access.may_replay(named):
                raise Forbidden(f"you may read provider {named!r} but not replay its events")
        async with self.scoped(access) as conn:
            if named is not None:
                names = [named]
            else:
                names = [r["name"] for r in await conn.fetch(db.query("providers", SQL), None)
                         if access.may_replay(r["name"])]
            row_ids = None
            if ids is not None:
                assert provider is not None
                found = await conn.fetch(db.query("event_ids", SQL), [provider] * len(ids), list(ids))
                if not found:
                    raise NotFound(f"no such event of provider {provider!r}")
                row_ids = [r["id"] for r in found]
            f = filters or EventFilter()
            rows = await conn.fetch(db.query("dead_to_replay", SQL), names, row_ids, f.type, f.entity,
                                    f.received_after, f.received_before, f.q, MAX_REPLAY + 1)
            result = await self._requeue(conn, access, INBOX, rows, dry_run)
        await self._replayed(access, result, "providers")
        return result

    # -- the outbox ------------------------------------------------------------------------------

    async def endpoints(self, access: Access) -> list[dict[str, Any]]:
        """The endpoints the Access may read, with their circuits, what waits and their recent rate."""
        if not access.reads_outbox:
            return []
        async with self.scoped(access) as conn:
            rows = await conn.fetch(db.query("endpoints", SQL), RECENT_SECONDS)
        return [{**{k: plain(v) for k, v in r.items()}, "recent_seconds": RECENT_SECONDS,
                 "rate_per_minute": round((r["recent_done"] + r["recent_failed"]) * 60 / RECENT_SECONDS, 2)}
                for r in rows]

    async def deliveries(self, access: Access, filters: dict[str, str], limit: int = DEFAULT_LIMIT,
                         cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        if not access.reads_outbox:
            return [], None
        if not 1 <= limit <= MAX_LIMIT:
            raise BadRequest("limit", f"limit must be from 1 to {MAX_LIMIT}")
        f = EventFilter.parse({k: v for k, v in filters.items() if k in ("status", "type", "q")},
                              statuses=DELIVERY_STATUSES)
        endpoint = filters.get("endpoint") or None
        if endpoint is not None and len(endpoint) > MAX_FILTER_CHARS:
            raise BadRequest("endpoint", f"endpoint is longer than {MAX_FILTER_CHARS} characters")
        (after_id,) = _decode_cursor(cursor, (int,)) if cursor else (None,)
        async with self.scoped(access) as conn:
            rows = await conn.fetch(db.query("deliveries_page", SQL), endpoint, f.status, f.type, f.q, after_id,
                                    limit + 1)
        items = [{k: plain(v) for k, v in r.items()} for r in rows[:limit]]
        return items, encode_cursor(rows[limit - 1]["id"]) if len(rows) > limit else None

    async def delivery(self, access: Access, delivery_id: int) -> dict[str, Any]:
        """One delivery: its outbox event's payload (as an event's body), the partner's last answer
        and every attempt (of an endpoint the Access may read)."""
        if not access.reads_outbox or not 1 <= delivery_id < 2**63:
            raise NotFound(f"no delivery {delivery_id}")
        async with self.scoped(access) as conn:
            row = await conn.fetchrow(db.query("delivery", SQL), delivery_id, MAX_BODY_BYTES)
            if row is None:
                raise NotFound(f"no delivery {delivery_id}")
            attempts = await conn.fetch(db.query("attempts", SQL), "deliveries", row["id"], row["created_at"])
        return {
            **{k: plain(v) for k, v in row.items() if k != "payload"},
            **_body(row["payload"].encode(), row["body_bytes"]),
            "attempt_log": [_attempt(a) for a in attempts],
        }

    async def replay_deliveries(self, access: Access, *, ids: Sequence[int] | None = None,
                                endpoint: str | None = None, dry_run: bool = False) -> dict[str, Any]:
        if not access.replays_every_endpoint and not access.endpoint_replay:
            raise Forbidden("replaying deliveries needs replay rights on the endpoint (patch on its WebhookEndpoint)")
        if endpoint is not None and not access.may_replay_endpoint(endpoint):
            # 404 for an endpoint it may not even read (never a 403 that says it exists).
            if endpoint in access.endpoints or access.install_wide:
                raise Forbidden(f"replaying deliveries of {endpoint!r} needs patch on its WebhookEndpoint")
            raise NotFound(f"no endpoint {endpoint!r}")
        if ids is not None and not 1 <= len(ids) <= MAX_IDS:
            raise BadRequest("ids", f"give from 1 to {MAX_IDS} delivery ids")
        async with self.scoped(access) as conn:
            replayable = None if access.replays_every_endpoint else sorted(access.endpoint_replay)
            rows = await conn.fetch(db.query("dead_deliveries_to_replay", SQL), None if ids is None else list(ids),
                                    endpoint, MAX_REPLAY + 1, replayable)
            result = await self._requeue(conn, access, OUTBOX, rows, dry_run)
        await self._replayed(access, result, "endpoints")
        return result

    @staticmethod
    async def _requeue(conn: asyncpg.Connection, access: Access, queue: Queue, rows: list[asyncpg.Record],
                       dry_run: bool) -> dict[str, Any]:
        """Requeue the dead ``rows`` (selected as the console's role, at most MAX_REPLAY + 1 to tell
        whether there were more) as the owner, and log who did it; the counts by provider (endpoint)."""
        part = queue.partition
        more = len(rows) > MAX_REPLAY
        rows = rows[:MAX_REPLAY]
        if dry_run or not rows:
            return {"dry_run": dry_run, "count": len(rows), "more": more}
        await conn.execute("RESET ROLE")  # the role has no write grant
        counts = await queue.replay_dead(conn, ids=[r["id"] for r in rows])
        requeued = [r for r in rows if r[part] in counts]
        await conn.execute(db.query("record_replays", SQL), queue.log_name, [r["id"] for r in requeued],
                           [r[part] for r in requeued], _who(access))
        return {"dry_run": False, "count": sum(counts.values()), "more": more,
                f"{part}s": dict(sorted(counts.items()))}

    async def _replayed(self, access: Access, result: dict[str, Any], key: str) -> None:
        """Tell the hooks, once the replay committed."""
        if result.get(key):
            for hook in self.replay_hooks:
                await hook(access, {key: result[key]})

    async def send_test_event(self, access: Access, endpoint: str) -> dict[str, Any]:
        """Publish a ``hookline.test`` event through the outbox to ``endpoint`` only (a WebhookEndpoint's
        in its namespace): who may replay the endpoint's deliveries may send it one."""
        if not access.reads_outbox:
            raise NotFound(f"no endpoint {endpoint!r}")
        async with self.scoped(access) as conn:
            row = await conn.fetchrow(db.query("endpoint_exists", SQL), endpoint)
            if row is None:
                raise NotFound(f"no endpoint {endpoint!r}")
            if not access.may_replay_endpoint(endpoint):
                raise Forbidden("sending a test event needs replay rights on the endpoint (patch on its resource)")
            await conn.execute("RESET ROLE")
            namespace, _, name = endpoint.rpartition("/")
            event_id = await outbox.publish(conn, TEST_EVENT_TYPE, {"test": True, "sent_by": access.subject},
                                            endpoint=name, namespace=namespace or None)
        return {"event_id": event_id, "endpoint": endpoint, "event_type": TEST_EVENT_TYPE,
                "parked": not row["enabled"]}


def _who(access: Access) -> str:
    return f"console:{access.subject}"[:200]


def _attempt(row: asyncpg.Record) -> dict[str, Any]:
    error, _, traceback = (row["error"] or "").partition("\n")
    return {"attempt": row["attempt"], "at": plain(row["at"]), "outcome": row["outcome"], "worker": row["worker"],
            "http_status": row["http_status"], "latency_ms": row["latency_ms"], "error": error or None,
            "traceback": traceback or None}


def _body(body: bytes, length: int) -> dict[str, Any]:
    """A stored body's first bytes as the pages and the API show it: text (undecodable bytes as
    U+FFFD), whether it was cut, and the JSON it parses to (when whole)."""
    truncated = length > len(body)
    parsed: Any = None
    parses = False
    if not truncated:
        with contextlib.suppress(ValueError, RecursionError):
            parsed, parses = json.loads(body), True
    return {"body": body.decode("utf-8", errors="replace"), "body_truncated": truncated,
            "body_valid_utf8": _valid_utf8(body), "body_json": parsed, "body_is_json": parses}


def _valid_utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
