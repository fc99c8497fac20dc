"""How an attempt ends, written in one place: the worker's completer.

After its claim, every change the worker makes to an event's row goes through ``Completer``, each
write guarded by (id, attempts, locked_by) so that it matches only while the lease is still ours
(a guarded write that matches nothing means another worker owns the event now: LOST):

* ``complete``: done, in the transaction that applied the handler's writes (one statement for a
  whole batch of them; an id missing from its answer lost its lease);
* ``complete_later``: done, for an effect outside our database, written in batches by the worker's
  ``BatchCompleter`` (service.py) and retried while the lease lasts;
* ``fail``: a failed attempt, retried after the provider's backoff or dead, on the pool or in a
  batch's transaction after the failed job's savepoint was rolled back;
* ``defer`` / ``bury``: an ordering event whose predecessor has not been applied yet, or has not
  been for too long;
* ``put_back``: a handler that cannot be imported (a configuration error): the event goes back to
  pending without the attempt being counted, so a broken deployment burns no retries.

``caught`` is the one reading of how the work of an attempt ended: what it returned, or the
exception that is the attempt's failure.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import TypeVar

import asyncpg

from hookline.core import db
from hookline.core.consumer import write_completion
from hookline.core.providers import Provider
from hookline.core.queue import INBOX, truncate_error
from hookline.worker.event import Event

log = logging.getLogger(__name__)

T = TypeVar("T")

# The attempt log keeps this much of a failed handler's error and traceback (log_attempts, migration 0027).
ATTEMPT_LOG_BYTES = 8192


class Result(Enum):
    DONE = "done"
    RETRY = "retry"
    DEFERRED = "deferred"
    DEAD = "dead"
    LOST = "lost"  # the lease was taken from us; nothing of this attempt was committed
    UNKNOWN = "unknown"  # the effect happened but "done" could not be written; the lease will expire
    PUT_BACK = "put_back"  # the handler cannot be imported: pending again, the attempt not counted


@dataclass(frozen=True)
class Outcome:
    result: Result
    error: str | None = None  # the failure booked, for the log line of a dead letter


DONE = Outcome(Result.DONE)
LOST = Outcome(Result.LOST)


class LeaseLost(Exception):
    """Another worker owns the event now; nothing of this attempt may be committed."""


class PermanentFailure(Exception):
    """Retrying cannot help (e.g. the destination answered 400): the event goes dead now."""


class RetryableFailure(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


async def caught(work: Awaitable[T]) -> T | Exception:
    """What ``work`` returned, or the exception it raised: the failure of its attempt. A
    CancelledError the work raised itself (a handler's own timeout) is a failure like any other;
    one that cancels the task running it (the worker stopping, the lease lost) goes on up."""
    try:
        return await work
    except asyncio.CancelledError as exc:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        failure = RuntimeError(repr(exc))
        failure.__cause__ = exc
        return failure
    except Exception as exc:
        return exc


def describe_failure(exc: Exception) -> tuple[str, bool, float | None]:
    """(error, permanent, retry_after) of an attempt that raised."""
    if isinstance(exc, PermanentFailure):
        return str(exc), True, None
    if isinstance(exc, RetryableFailure):
        return str(exc), False, exc.retry_after
    # A handler that raises or a payload it cannot read: retried, then dead.
    return f"{type(exc).__name__}: {exc}", False, None


def bounded(text: str, limit: int = ATTEMPT_LOG_BYTES) -> str:
    """``text`` in at most ``limit`` bytes of UTF-8: its middle cut out, with a marker, when it is
    longer (a traceback's first lines say where it began, its last ones what was raised)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    head = limit // 4
    tail = limit - head - len("\n... (99999999 bytes cut) ...\n")  # room for the marker
    marker = f"\n... ({len(data) - head - tail} bytes cut) ...\n"
    return data[:head].decode(errors="ignore") + marker + data[-tail:].decode(errors="ignore")


def handler_traceback(exc: Exception, secrets: Iterable[str]) -> str | None:
    """The traceback of a handler's failure, secrets masked; None when there is none to keep."""
    if exc.__traceback__ is None and exc.__cause__ is None:
        return None
    text = "".join(traceback.format_exception(exc))
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


class Completer:
    """Every state an attempt leaves its event in, written guarded by the lease (module docstring)."""

    def __init__(self, worker_id: str, complete_later: Callable[[int, int], Awaitable[bool]]) -> None:
        self.worker_id = worker_id
        self._complete_later = complete_later

    async def complete(self, conn: asyncpg.Connection, done: Sequence[tuple[int, int]]) -> set[int]:
        """Mark (id, attempts) pairs done in ``conn``'s transaction (a handler's, which plans as Postgres
        does by default: the pool's plan settings come back first); the ids whose lease was still ours."""
        await conn.execute(db.GENERIC_PLAN_SETTINGS_LOCAL)
        return await INBOX.complete(conn, done, self.worker_id)

    async def complete_later(self, event: Event, provider: Provider) -> Result:
        """Write "done" for an effect that happened outside our database (see ``write_completion``:
        retried while the lease lasts, then unknown; never a retry or a dead letter)."""
        context: dict[str, object] = {"provider": event.provider, "event_id": event.event_id}
        booked = await write_completion(lambda: self._complete_later(event.id, event.attempts),
                                        provider.lease_seconds, context)
        return Result.UNKNOWN if booked is None else Result.DONE if booked else Result.LOST

    async def fail(self, conn: asyncpg.Connection | asyncpg.Pool, event: Event, provider: Provider,
                   exc: Exception, clock_lag: float = 0.0) -> Outcome:
        """Book a failed attempt on ``conn`` (the pool, or a batch's transaction whose now() is
        ``clock_lag`` seconds behind the clock): retry or dead. A handler's traceback goes to the
        attempt log with the error; the event's row keeps the error alone."""
        secrets = [*provider.signature.secrets, provider.destination_secret or ""]
        error, permanent, retry_after = describe_failure(exc)
        error = truncate_error(error, secrets)
        trace = handler_traceback(exc, secrets) if provider.handler else None
        if permanent or event.attempts >= provider.retry.max_attempts:
            if not permanent:
                error = f"gave up after {event.attempts} attempt{'' if event.attempts == 1 else 's'}: {error}"
            detail = None if trace is None else bounded(f"{error}\n{trace}")
            if not await INBOX.bury(conn, event.id, event.attempts, self.worker_id, error, detail):
                return LOST
            return Outcome(Result.DEAD, error)
        delay = provider.retry.next_delay(event.attempts, retry_after) + clock_lag
        detail = None if trace is None else bounded(f"{error}\n{trace}")
        if not await INBOX.retry(conn, event.id, event.attempts, self.worker_id, delay, error, detail):
            return LOST
        # One line per failed attempt: a handler that fails is seen at its first failure, not
        # hours later when the event is dead.
        next_attempt = datetime.now(UTC) + timedelta(seconds=delay - clock_lag)
        log.warning("attempt failed; will retry", extra={
            "provider": event.provider, "event_id": event.event_id,
            "attempt": f"{event.attempts} of {provider.retry.max_attempts}",
            "next_attempt_at": next_attempt.isoformat(timespec="seconds"),
            "retry_in_seconds": round(delay - clock_lag, 1), "error": (error.splitlines() or [""])[0][:300]})
        return Outcome(Result.RETRY)

    async def defer(self, conn: asyncpg.Connection, event: Event, seconds: float, reason: str) -> bool:
        """Back to pending for ``seconds``, the attempt not counted (waiting for a predecessor is
        not a failure); False when the lease was lost."""
        return await conn.fetchval(db.query("defer_event"), event.id, event.attempts, self.worker_id,
                                   seconds, reason) is not None

    async def bury(self, conn: asyncpg.Connection, event: Event, reason: str) -> bool:
        """Dead now, for ``reason``; False when the lease was lost."""
        return await INBOX.bury(conn, event.id, event.attempts, self.worker_id, reason)

    async def put_back(self, pool: asyncpg.Pool, event: Event, seconds: float, problem: str) -> Outcome:
        """Pending again in ``seconds``, the attempt not counted, ``problem`` as its last error."""
        put_back = await pool.fetchval(db.query("put_back", "worker.sql"), event.id, event.attempts,
                                       self.worker_id, float(seconds), problem)
        return LOST if put_back is None else Outcome(Result.PUT_BACK)
