"""What happens to one claimed inbox event: the exactly-once recipe.

Three paths, chosen by the provider:

* ``handler`` taking ``(event, conn)``: the handler runs inside a transaction
  that ends with the guarded UPDATE marking the event done — guarded by (id,
  attempts, locked_by), so it matches only while the lease is still ours. If it
  does not match, the transaction rolls back with the handler's writes. No row
  lock is taken before the handler runs (that cost a round trip per event): the
  lease, kept alive by the heartbeat, is what keeps other workers away. The
  handler's database writes and "done" commit together or not at all, so a
  crash or a lost lease can never leave them applied twice.

  What a handler may observe after a lost lease (its worker stalled longer than
  ``leaseSeconds``, the sweeper took the event back and another worker claimed
  it): the same event running at the same time in another worker, with a higher
  ``event.attempts``; its own writes waiting for that attempt's row locks, or
  failing on its unique keys; and being cancelled when the heartbeat notices the
  loss. At most one of the attempts commits. Effects outside the transaction
  (HTTP calls, files) are not rolled back and may happen twice.
* ``handler`` taking ``(event)`` or a ``destination`` URL: the effect is outside
  our database, so it runs without a transaction and "done" is written in
  batches. The lease is kept (the heartbeat extends it) until "done" commits; a
  failed write is retried while the lease lasts and then left alone: the outcome
  is unknown, the lease expires, and the next attempt repeats the effect. The
  ``Idempotency-Key: <provider>:<event_id>`` header lets the receiving side
  collapse such a repeat (or one after a crash) into one effect.
* ``ordering``: the entity's state row is locked, the transition checked, and the
  effect, the new state, "done", and the release of the entity's deferred events
  commit in one transaction, guarded like the handler's.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum

import aiohttp
import asyncpg

from hookline.core import db, delivery, metrics
from hookline.core.consumer import write_completion
from hookline.core.providers import Provider, Transition
from hookline.core.queue import INBOX, truncate_error
from hookline.core.signatures import sign_standard_webhooks
from hookline.worker.event import Event

log = logging.getLogger(__name__)

Handler = Callable[..., Awaitable[None]]


class Result(Enum):
    DONE = "done"
    RETRY = "retry"
    DEFERRED = "deferred"
    DEAD = "dead"
    LOST = "lost"  # the lease was taken from us; nothing of this attempt was committed
    UNKNOWN = "unknown"  # the effect happened but "done" could not be written; the lease will expire


class LeaseLost(Exception):
    """Another worker owns the event now; nothing of this attempt may be committed."""


class PermanentFailure(Exception):
    """Retrying cannot help (e.g. the destination answered 400): the event goes dead now."""


class RetryableFailure(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class LoadedHandler:
    function: Handler
    transactional: bool  # takes (event, conn)


_handlers: dict[str, LoadedHandler] = {}


def load_handler(path: str) -> LoadedHandler:
    """Import ``package.module:function`` once; a handler of one parameter runs without a transaction."""
    if path not in _handlers:
        module_name, _, attr = path.partition(":")
        function = getattr(importlib.import_module(module_name), attr)
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"handler {path} must be an async function")
        transactional = len(inspect.signature(function).parameters) >= 2
        _handlers[path] = LoadedHandler(function, transactional)
    return _handlers[path]


def find_transition(provider: Provider, event_type: str | None) -> Transition | None:
    if provider.ordering is None or event_type is None:
        return None
    return next((t for t in provider.ordering.transitions if t.on == event_type), None)


class Processor:
    def __init__(self, pool: asyncpg.Pool, session: aiohttp.ClientSession, worker_id: str,
                 complete_later: Callable[[int, int], Awaitable[bool]],
                 effect_done: Callable[[int], None] = lambda _id: None) -> None:
        self.pool = pool
        self.session = session
        self.worker_id = worker_id
        self._complete_later = complete_later
        self._effect_done = effect_done

    async def process(self, event: Event, provider: Provider, deferred_since: float | None) -> Result:
        started = time.perf_counter()
        try:
            transition = find_transition(provider, event.event_type)
            if transition is not None and event.entity_key is None:
                assert provider.ordering is not None
                raise PermanentFailure(f"no entity key at {provider.ordering.entity_key.describe()}")
            if transition is not None:
                result = await self._in_transaction(event, provider, transition, deferred_since)
            elif provider.handler and load_handler(provider.handler).transactional:
                result = await self._in_transaction(event, provider, None, None)
            else:
                await self._effect(event, provider, None)
                self._effect_done(event.id)
                result = await self._book_effect(event, provider)
        except LeaseLost:
            result = Result.LOST
        except PermanentFailure as exc:
            result = await self._finish_failure(event, provider, str(exc), permanent=True)
        except RetryableFailure as exc:
            result = await self._finish_failure(event, provider, str(exc), retry_after=exc.retry_after)
        except Exception as exc:
            # A handler that raises, a payload it cannot read, an import error: all retried, then dead.
            result = await self._finish_failure(event, provider, f"{type(exc).__name__}: {exc}")
        metrics.handler_duration.labels(event.provider).observe(time.perf_counter() - started)
        metrics.worker_events.labels(event.provider, result.value).inc()
        return result

    async def _book_effect(self, event: Event, provider: Provider) -> Result:
        """Write "done" for an effect that happened outside our database (see ``write_completion``:
        retried while the lease lasts, then unknown; never a retry or a dead letter)."""
        booked = await write_completion(lambda: self._complete_later(event.id, event.attempts), provider.lease_seconds,
                                        {"provider": event.provider, "event_id": event.event_id})
        return Result.UNKNOWN if booked is None else Result.DONE if booked else Result.LOST

    async def _effect(self, event: Event, provider: Provider, conn: asyncpg.Connection | None) -> None:
        if provider.handler:
            handler = load_handler(provider.handler)
            await (handler.function(event, conn) if handler.transactional else handler.function(event))
        elif provider.destination:
            await self._call_destination(event, provider)
        else:
            raise PermanentFailure(f"provider {provider.name} has neither handler nor destination")

    async def _call_destination(self, event: Event, provider: Provider) -> None:
        assert provider.destination is not None
        headers = {
            "Content-Type": event.content_type or "application/json",
            "Hookline-Event-Id": event.event_id,
            "Hookline-Provider": event.provider,
            "Idempotency-Key": event.idempotency_key,
        }
        if provider.destination_secret:
            headers.update(sign_standard_webhooks([provider.destination_secret], event.idempotency_key,
                                                  int(time.time()), event.body))
        answer = await delivery.post(self.session, provider.destination.url, event.body, headers,
                                     timeout=provider.destination.timeout_seconds)
        if answer.ok:
            return
        if answer.status is None or answer.status in (408, 425, 429) or answer.status >= 500:
            raise RetryableFailure(f"destination: {answer.describe()}", answer.retry_after)
        raise PermanentFailure(f"destination rejected the event: {answer.describe()}")

    async def _in_transaction(self, event: Event, provider: Provider, transition: Transition | None,
                              deferred_since: float | None) -> Result:
        async with self.pool.acquire() as conn, conn.transaction():
            if transition is not None:
                assert provider.ordering is not None and event.entity_key is not None
                state = await conn.fetchval(db.query("lock_entity_state"), provider.name, event.entity_key)
                if state not in transition.from_states:
                    return await self._defer(conn, event, provider, transition, state, deferred_since)
            await self._effect(event, provider, conn)
            if transition is not None:
                await conn.execute(db.query("set_entity_state"), provider.name, event.entity_key, transition.to)
                await conn.fetchrow(db.query("release_deferred"), provider.name, event.entity_key)
            # The guarded UPDATE proves the lease is still ours; if it is not, raising rolls the
            # handler's writes back with it, so a lost lease never commits an effect.
            if not await INBOX.complete(conn, [(event.id, event.attempts)], self.worker_id):
                raise LeaseLost()
        return Result.DONE

    async def _defer(self, conn: asyncpg.Connection, event: Event, provider: Provider, transition: Transition,
                     state: str | None, deferred_since: float | None) -> Result:
        assert provider.ordering is not None
        waited = time.time() - deferred_since if deferred_since else 0.0
        remaining = provider.ordering.max_deferral_seconds - waited
        wanted = " or ".join("no state" if s is None else repr(s) for s in transition.from_states)
        reason = (f"precondition_not_met: {event.event_type} needs entity {event.entity_key} in {wanted}, "
                  f"found {'no state' if state is None else repr(state)}")
        if remaining <= 0:
            if not await INBOX.bury(conn, event.id, event.attempts, self.worker_id,
                                    f"{reason} after waiting {waited:.0f} s"):
                raise LeaseLost()
            return Result.DEAD
        # Applying the predecessor releases us at once; until then look again now and then.
        if await conn.fetchval(db.query("defer_event"), event.id, event.attempts, self.worker_id,
                               min(remaining, 30.0), reason) is None:
            raise LeaseLost()
        return Result.DEFERRED

    async def _finish_failure(self, event: Event, provider: Provider, error: str, *, permanent: bool = False,
                              retry_after: float | None = None) -> Result:
        error = truncate_error(error, [*provider.signature.secrets, provider.destination_secret or ""])
        if permanent or event.attempts >= provider.retry.max_attempts:
            if not permanent:
                error = f"gave up after {event.attempts} attempts: {error}"
            if not await INBOX.bury(self.pool, event.id, event.attempts, self.worker_id, error):
                return Result.LOST
            log.warning("event dead", extra={"provider": event.provider, "event_id": event.event_id,
                                             "attempts": event.attempts, "error": error[:300]})
            return Result.DEAD
        delay = provider.retry.next_delay(event.attempts, retry_after)
        ok = await INBOX.retry(self.pool, event.id, event.attempts, self.worker_id, delay, error)
        return Result.RETRY if ok else Result.LOST
