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

  Under load several such events of one provider share a transaction
  (``TransactionBatches``), and one guarded completion for all of them ends the
  batch. They run first without savepoints; if anything goes wrong the batch
  rolls back to its start and runs again with a savepoint per event, so a
  handler may run twice for one attempt (only the last run's writes commit).
  With savepoints: a handler that raises rolls back to
  its savepoint (its failure is booked for retry or dead right there) and its
  batch-mates commit with their "done" rows. An event whose lease is gone by then
  is missing from the completion's answer: the batch rolls back to that event's
  savepoint — its effect and everything after it — completes the events before
  it, and the events after it run again in a later batch (their effects were
  rolled back, so each still commits once). Idle, a batch is one event.

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

A handler that cannot be imported is a configuration error, not a failure of its events:
``HandlerImports`` reports it once (a log line, and a row ``hookline status`` reads), its
events go back to pending without their attempts counted, and it is tried again every
``HandlerImports.RECHECK_SECONDS`` (the worker claims nothing for that provider meanwhile).

Calls go one way: ``Processor`` picks the path; ``TransactionBatches`` runs transactions of
one or more events; ``Effects`` runs an event's effect; ``Completer`` (completer.py) writes
how every attempt ended, whichever path it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from hookline.core import db, delivery, metrics, settings, tracing
from hookline.core.batching import Batcher
from hookline.core.http_client import WebhookClient
from hookline.core.providers import Provider, Transition
from hookline.core.signatures import sign_standard_webhooks
from hookline.worker.completer import (
    DONE,
    LOST,
    Completer,
    LeaseLost,
    Outcome,
    PermanentFailure,
    Result,
    RetryableFailure,
    caught,
)
from hookline.worker.event import Event

log = logging.getLogger(__name__)

Handler = Callable[..., Awaitable[None]]


class AbortedByHandler(Exception):
    """The handler returned, but one of its statements had failed and its transaction was left
    aborted (the error was caught, not raised): a failure of that handler's event."""


class ConnectionLost(Exception):
    """The server ended a batch's connection (a failover, a restart): its transaction is gone and
    no handler is at fault; every event of the batch fails this attempt and runs again."""


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


@dataclass(frozen=True)
class ClaimedEvent:
    """One claimed event on its way through a transaction (alone, or in a batch)."""

    event: Event
    provider: Provider
    transition: Transition | None
    deferred_since: float | None


def savepoint_name(position: int) -> str:
    """The savepoint of the job at ``position`` in its batch's run order."""
    return f"hookline_job_{position}"


# Handlers plan as Postgres does by default; the worker's pool plans its own statements once, through
# indexes (db.GENERIC_PLAN_SETTINGS). They name their tables as they would anywhere: on the search path
# HOOKLINE_HANDLER_SEARCH_PATH (Postgres's default unless set), where the worker's own statements run
# on a pinned one (db.PINNED_SEARCH_PATH).
HANDLER_SETTINGS = f"{db.DEFAULT_PLAN_SETTINGS_LOCAL}; SET LOCAL search_path = {settings.handler_search_path()}"


@contextlib.asynccontextmanager
async def handler_transaction(conn: asyncpg.Connection, first: str = "") -> AsyncIterator[None]:
    """A transaction for handlers: BEGIN, their settings and ``first`` (statements without
    parameters) in one round trip; COMMIT at the end, ROLLBACK if the block raises."""
    await conn.execute(f"BEGIN; {HANDLER_SETTINGS}; {first}")
    try:
        yield
    except BaseException:
        await rollback(conn)
        raise
    await conn.execute("COMMIT")


def lost_connection(seen: Exception) -> ConnectionLost:
    """The batch's failure for ``seen``, the first error on a connection the server ended (often
    asyncpg's "released back to the pool", which would read as a bug of ours)."""
    failure = ConnectionLost(f"the connection to Postgres was lost mid-transaction ({type(seen).__name__})")
    failure.__cause__ = seen
    return failure


async def rollback(conn: asyncpg.Connection) -> None:
    """Roll back a transaction begun by hand; if even that fails, releasing the connection to
    the pool rolls it back (asyncpg does so for any connection left in a transaction)."""
    with contextlib.suppress(Exception):
        await conn.execute("ROLLBACK")


@dataclass
class _Unimportable:
    handler: str
    error: str
    checked_at: float  # time.monotonic() of the last try


class HandlerImports:
    """Providers whose handler cannot be imported: a configuration error, not a failure of their
    events. Reported once per problem (a log line, and ``hookline.handler_problems``, which
    ``hookline status`` reads), and tried again every RECHECK_SECONDS; meanwhile the worker claims
    nothing for the provider (``waiting``), and what it had claimed goes back without counting."""

    RECHECK_SECONDS = 10.0

    def __init__(self, pool: asyncpg.Pool, worker_id: str) -> None:
        self._pool = pool
        self._worker_id = worker_id
        self._unimportable: dict[str, _Unimportable] = {}  # by provider name
        self._imported: set[tuple[str, str]] = set()  # (provider, handler) loaded and reported fine
        self._clearing: set[asyncio.Task[None]] = set()

    async def stop(self) -> None:
        await asyncio.gather(*self._clearing)

    def waiting(self, provider: Provider) -> bool:
        """True while the provider's handler is known not to import and is not due for another try."""
        known = self._unimportable.get(provider.name)
        return (known is not None and known.handler == provider.handler
                and time.monotonic() - known.checked_at < self.RECHECK_SECONDS)

    async def load(self, provider: Provider, path: str) -> LoadedHandler | str:
        """The provider's handler, or why it cannot be imported."""
        loaded = _handlers.get(path)
        if loaded is not None and (provider.name, path) in self._imported:
            return loaded
        known = self._unimportable.get(provider.name)
        if known is not None and known.handler == path:
            if time.monotonic() - known.checked_at < self.RECHECK_SECONDS:
                return known.error
            importlib.invalidate_caches()  # a module installed since the last try is found
        try:
            loaded = load_handler(path)
        except Exception as exc:  # whatever stops the import: the event never ran
            error = f"{type(exc).__name__}: {exc}"
            self._unimportable[provider.name] = _Unimportable(path, error, time.monotonic())
            if known is None or (known.handler, known.error) != (path, error):
                log.error("handler cannot be imported: its events wait, their attempts not counted, and it is "
                          "tried again every %g s", self.RECHECK_SECONDS,
                          extra={"provider": provider.name, "handler": path, "error": error[:300]})
                await self._report(provider.name, path, error)
            return error
        self._imported.add((provider.name, path))
        if self._unimportable.pop(provider.name, None) is not None:
            log.info("handler imports again", extra={"provider": provider.name, "handler": path})
        # Clear what this or an earlier worker reported, beside the event rather than before it: the
        # first event of a provider is not held back a round trip behind its batch-mates.
        clearing = asyncio.create_task(self._report(provider.name, path, None))
        self._clearing.add(clearing)
        clearing.add_done_callback(self._clearing.discard)
        return loaded

    async def _report(self, provider: str, handler: str, problem: str | None) -> None:
        try:
            await self._pool.execute(db.query("report_handler_problem", "worker.sql"), provider, handler,
                                     problem if problem is None else problem[:2000], self._worker_id)
        except Exception as exc:  # the log line stands; the next change of state reports again
            log.warning("could not record the handler's state for hookline status",
                        extra={"provider": provider, "error": f"{type(exc).__name__}: {exc}"[:300]})


class Effects:
    """An event's effect: its handler, or the call to its destination, and under ``ordering`` the
    entity's new state; what it decides about the event (deferred, dead) its ``Completer`` writes."""

    def __init__(self, session: WebhookClient, completer: Completer) -> None:
        self.session = session
        self._completer = completer

    async def apply(self, conn: asyncpg.Connection, job: ClaimedEvent) -> Result:
        """The effect and the entity's new state inside the caller's transaction or savepoint; DONE
        means the completion is still to be written (a deferral or dead letter is booked here)."""
        event, provider, transition = job.event, job.provider, job.transition
        if transition is not None:
            assert provider.ordering is not None and event.entity_key is not None
            state = await conn.fetchval(db.query("lock_entity_state"), provider.name, event.entity_key)
            if state not in transition.from_states:
                return await self._defer(conn, event, provider, transition, state, job.deferred_since)
        await self.run(event, provider, conn)
        if transition is not None:
            await conn.execute(db.query("set_entity_state"), provider.name, event.entity_key, transition.to)
            await conn.fetchrow(db.query("release_deferred"), provider.name, event.entity_key)
        return Result.DONE

    async def run(self, event: Event, provider: Provider, conn: asyncpg.Connection | None) -> None:
        if not tracing.enabled():  # the common case: no span to build per event
            return await self._run_effect(event, provider, conn, None)
        # The handler span continues the receiver's (core/tracing.py); outbox events the handler
        # publishes, and the destination call, carry it on.
        with tracing.span("hookline.handle", event.headers.get("traceparent"), tracing.CONSUMER,
                          {"hookline.provider": event.provider, "hookline.event_id": event.event_id,
                           "hookline.attempt": event.attempts}) as traceparent:
            await self._run_effect(event, provider, conn, traceparent)

    async def _run_effect(self, event: Event, provider: Provider, conn: asyncpg.Connection | None,
                          traceparent: str | None) -> None:
        if provider.handler:
            handler = load_handler(provider.handler)
            await (handler.function(event, conn) if handler.transactional else handler.function(event))
        elif provider.destination:
            await self._call_destination(event, provider, traceparent)
        else:
            raise PermanentFailure(f"provider {provider.name} has neither handler nor destination")

    async def _call_destination(self, event: Event, provider: Provider, traceparent: str | None) -> None:
        assert provider.destination is not None
        headers = {
            "Content-Type": event.content_type or "application/json",
            "Hookline-Event-Id": event.event_id,
            "Hookline-Provider": event.provider,
            "Idempotency-Key": event.idempotency_key,
        }
        if traceparent is not None:
            headers["traceparent"] = traceparent
        if provider.destination_secret:
            headers.update(sign_standard_webhooks([provider.destination_secret], event.idempotency_key,
                                                  int(time.time()), event.body))
        answer = await self.session.post(provider.destination.url, event.body, headers,
                                         timeout=provider.destination.timeout_seconds)
        if answer.ok:
            return
        if delivery.worth_retrying(answer):
            raise RetryableFailure(f"destination: {answer.describe()}", answer.retry_after)
        raise PermanentFailure(f"destination rejected the event: {answer.describe()}")

    async def _defer(self, conn: asyncpg.Connection, event: Event, provider: Provider, transition: Transition,
                     state: str | None, deferred_since: float | None) -> Result:
        assert provider.ordering is not None
        waited = time.time() - deferred_since if deferred_since else 0.0
        remaining = provider.ordering.max_deferral_seconds - waited
        wanted = " or ".join("no state" if s is None else repr(s) for s in transition.from_states)
        reason = (f"precondition_not_met: {event.event_type} needs entity {event.entity_key} in {wanted}, "
                  f"found {'no state' if state is None else repr(state)}")
        if remaining <= 0:
            if not await self._completer.bury(conn, event, f"{reason} after waiting {waited:.0f} s"):
                raise LeaseLost()
            return Result.DEAD
        # Applying the predecessor releases us at once; until then look again now and then.
        if not await self._completer.defer(conn, event, min(remaining, 30.0), reason):
            raise LeaseLost()
        return Result.DEFERRED


class TransactionBatches:
    """Runs transactional handlers of one provider several to a transaction, each in a savepoint.

    Jobs queue up while batches run, and a free transaction takes a share of what has queued:
    one job when idle, so latency is a single transaction's; several under a backlog, so one
    commit serves them all while a few transactions still overlap. How many transactions run
    at once follows the handlers' pace: fast handlers share two (were every in-flight event
    given its own transaction, nothing would ever queue and every event would pay for a
    commit), slow ones get up to one each, as unbatched. A batch takes no more jobs
    than fit in ``max_seconds`` at the handlers' recent pace, and starts none after that time
    (the rest queue again), so a slow handler holds its batch-mates' row locks only briefly
    and slow handlers run side by side, one per transaction, as they would unbatched. Within a
    batch jobs run by (entity key, id): events of one entity in the order they arrived, and
    entity-state rows locked in the same order by every batch.

    A batch first runs its jobs one after another with no savepoint of their own and completes
    them: when all goes well, as it nearly always does, a job costs no round trip besides the
    handler's own; the batch adds its begin, one completion statement for all its jobs, and its
    commit. When anything goes wrong (a handler raises or leaves the transaction aborted, a
    lease is lost) the pass is rolled back to the batch's first savepoint and the batch runs
    again with a savepoint per job, which keeps each failure to its own job: a round trip more
    per job, and for the next CAREFUL_BATCHES batches too. So a handler may run twice for one
    attempt, its first run's writes rolled back.
    """

    # A batch takes its transaction's share of what has queued (at least EVEN_SHARE jobs), so
    # a backlog keeps the transactions' commits overlapping rather than one long transaction.
    # 16 is half the default concurrency: two batches overlap, and a batch's begin, completion
    # and commit serve 16 jobs (with 8, a transactional no-op drain cost a third more CPU in
    # the worker and half as much again in Postgres per event).
    EVEN_SHARE = 16
    # Enough transactions that each batch's handlers take about this long (a fraction of
    # max_seconds: a batch's row locks are held briefly), and never fewer than MIN_TRANSACTIONS,
    # so one batch runs while another commits.
    BATCH_TIME_SHARE = 4
    MIN_TRANSACTIONS = 2
    # Every job's savepoint becomes a subtransaction with its own id once the batch writes. A
    # backend keeps up to 64 of those in shared memory; past that, every snapshot taken anywhere
    # in the cluster while the batch runs has to look them up in pg_subtrans (slow for all).
    MAX_JOBS = 60
    # After a batch that had to run again job by job, this many batches go job by job at once: a
    # provider whose handlers keep failing pays for no passes that are thrown away.
    CAREFUL_BATCHES = 10

    def __init__(self, effects: Effects, completer: Completer, pool: asyncpg.Pool, name: str, *,
                 transactions: int, max_batch: int, max_seconds: float) -> None:
        self._effects = effects
        self._completer = completer
        self._pool = pool
        self._max_seconds = max_seconds
        self._transactions = transactions
        self._job_seconds = 0.001  # recent time per job, a moving average
        self._transaction_seconds = 0.001  # recent time per batch, from its start to its commit
        self._careful_batches = 0  # batches still to run with savepoints after one that went wrong
        self._batcher: Batcher[ClaimedEvent, Outcome | None] = Batcher(
            self._run, name=f"transactions:{name}", max_batch=max_batch, window=0.0, writers=transactions,
            limit=self._limit, active=self._active_transactions)
        self._batcher.start()

    async def run(self, job: ClaimedEvent, *, alone: bool = False) -> Outcome:
        """Run ``job`` in a transaction and book its outcome. ``alone``: in a transaction of its own
        at once, never with other jobs (a suspect, or an ordering event without a handler's
        transaction)."""
        if alone:
            return await self._run_alone(job)
        while True:
            try:
                outcome = await self._batcher.submit(job)
            except Exception as exc:  # the batch's own statements failed (its commit, its connection)
                return await self._completer.fail(self._pool, job.event, job.provider, exc)
            if outcome is not None:
                return outcome

    async def stop(self, timeout: float) -> None:
        await self._batcher.stop(timeout)

    def _active_transactions(self) -> int:
        """As many transactions as it takes for the jobs in flight (up to one per transaction)
        to finish their handlers in max_seconds / BATCH_TIME_SHARE, and for a job that arrives
        to wait no longer than that for a free transaction: when commits are slow (a loaded disk
        flushing WAL), more transactions run side by side instead of jobs queueing behind them."""
        share = self._max_seconds / self.BATCH_TIME_SHARE
        for_handlers = -(-self._transactions * self._job_seconds // share)
        for_commits = -(-self._transaction_seconds // share)
        return max(self.MIN_TRANSACTIONS, min(self._transactions, int(max(for_handlers, for_commits))))

    def _limit(self, queued: int) -> int:
        fit = int(self._max_seconds / max(self._job_seconds, 1e-6))
        return min(fit, max(self.EVEN_SHARE, -(-queued // self._active_transactions())))

    async def _run(self, jobs: list[ClaimedEvent]) -> list[Outcome | None]:
        started = time.monotonic()
        try:
            return await self._run_batch(jobs)
        finally:
            self._transaction_seconds = 0.7 * self._transaction_seconds + 0.3 * (time.monotonic() - started)

    async def _run_batch(self, jobs: list[ClaimedEvent]) -> list[Outcome | None]:
        if len(jobs) == 1:
            metrics.worker_batch_size.observe(1)
            return [await self._run_alone(jobs[0])]
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i].event.entity_key or "", jobs[i].event.id))
        # One round trip opens the transaction and the first job's savepoint. Deferred constraints
        # are checked at each statement, so a violation fails its own event's savepoint, not the
        # batch's commit.
        async with (self._pool.acquire() as conn,
                    handler_transaction(conn, f"SET CONSTRAINTS ALL IMMEDIATE; SAVEPOINT {savepoint_name(0)}")):
            if self._careful_batches:
                self._careful_batches -= 1
            else:
                outcomes = await self._run_without_savepoints(conn, jobs, order)
                if outcomes is not None:
                    return outcomes
                # Something went wrong: undo the whole pass, and run the batch again job by job.
                await conn.execute(f"ROLLBACK TO SAVEPOINT {savepoint_name(0)}")
                self._careful_batches = self.CAREFUL_BATCHES
                metrics.worker_batch_reruns.inc()
            return await self._run_in_savepoints(conn, jobs, order)

    async def _run_alone(self, job: ClaimedEvent) -> Outcome:
        """One job in its own transaction, no savepoint round trips (the idle case, and suspects);
        a failure is booked after the rollback, on the pool."""
        result = await caught(self._committed(job))
        if isinstance(result, LeaseLost):
            return LOST
        if isinstance(result, Exception):
            return await self._completer.fail(self._pool, job.event, job.provider, result)
        return DONE if result is Result.DONE else Outcome(result)

    async def _committed(self, job: ClaimedEvent) -> Result:
        event = job.event
        async with self._pool.acquire() as conn, handler_transaction(conn):
            began = time.monotonic()
            result = await self._effects.apply(conn, job)
            # The guarded UPDATE proves the lease is still ours; if it is not, raising rolls the
            # handler's writes back with it, so a lost lease never commits an effect.
            if result is Result.DONE and not await self._completer.complete(conn, [(event.id, event.attempts)]):
                raise LeaseLost()
            self._record_pace(time.monotonic() - began)
            return result

    async def _run_without_savepoints(self, conn: asyncpg.Connection, jobs: list[ClaimedEvent],
                                      order: list[int]) -> list[Outcome | None] | None:
        """Every job of the batch, none in a savepoint of its own (a round trip less each), and
        their completion; None, with nothing undone yet, as soon as anything goes wrong: a handler
        raises, a lease is lost, or the transaction is left aborted. The caller then rolls the
        batch back to its first savepoint and runs it again job by job, which finds the culprit.
        A connection the server ended raises ConnectionLost instead: the batch fails as a whole."""
        outcomes: list[Outcome | None] = [None] * len(jobs)
        began = time.monotonic()
        ran: list[int] = []
        for i in order:
            if ran and time.monotonic() - began >= self._max_seconds:
                break
            result = await caught(self._effects.apply(conn, jobs[i]))
            if isinstance(result, Exception):
                if db.connection_lost(conn):  # nothing to roll back to: the batch fails as a whole
                    raise lost_connection(result)
                return None
            outcomes[i] = DONE if result is Result.DONE else Outcome(result)
            ran.append(i)
        self._record_pace(time.monotonic() - began, len(ran))
        applied = [(jobs[i].event.id, jobs[i].event.attempts) for i in ran if outcomes[i] == DONE]
        if applied:
            try:
                done = await self._completer.complete(conn, applied)
            except asyncpg.InFailedSQLTransactionError:
                return None
            if len(done) != len(applied):
                return None
        metrics.worker_batch_size.observe(len(ran))
        return outcomes

    async def _run_in_savepoints(self, conn: asyncpg.Connection, jobs: list[ClaimedEvent],
                                 order: list[int]) -> list[Outcome | None]:
        """Every job of the batch in its own savepoint, the first one open already."""
        outcomes: list[Outcome | None] = [None] * len(jobs)
        ran: list[int] = []  # indexes into jobs, in the order they ran: job ran[p] has savepoint p
        began = time.monotonic()
        for i in order:
            if ran:
                if time.monotonic() - began >= self._max_seconds:
                    break
                # Savepoints stay open (nested): a lease found lost at the end is cut off at its own.
                await self._savepoint(conn, jobs, outcomes, ran)
            outcomes[i] = await self._in_savepoint(conn, jobs[i], savepoint_name(len(ran)))
            ran.append(i)
        self._record_pace(time.monotonic() - began, len(ran))
        await self._complete(conn, jobs, outcomes, ran)
        metrics.worker_batch_size.observe(len(ran))
        return outcomes

    async def _in_savepoint(self, conn: asyncpg.Connection, job: ClaimedEvent, savepoint: str) -> Outcome:
        """One job of a batch, inside the open ``savepoint``: DONE means its effect applied and its
        completion is the batch's to write (``_complete``); a handler that raised, or a deferral
        whose lease was lost, rolls back to the savepoint (a failure is then booked in the same
        transaction)."""
        result = await caught(self._effects.apply(conn, job))
        if isinstance(result, Exception) and db.connection_lost(conn):
            raise lost_connection(result)  # the batch's transaction is gone with its connection
        if isinstance(result, LeaseLost):
            await conn.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
            return LOST
        if isinstance(result, Exception):
            return await self._failed_in_savepoint(conn, job, savepoint, result)
        return DONE if result is Result.DONE else Outcome(result)

    async def _failed_in_savepoint(self, conn: asyncpg.Connection, job: ClaimedEvent, savepoint: str,
                                   failure: Exception) -> Outcome:
        """Roll the job back to its ``savepoint`` and book its failure in the batch's transaction."""
        await conn.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
        # The retry statement counts its delay from now(), the batch transaction's start: add
        # the time since, so the backoff starts when the attempt failed.
        since_begin = float(await conn.fetchval(db.query("transaction_age")))
        return await self._completer.fail(conn, job.event, job.provider, failure, since_begin)

    async def _savepoint(self, conn: asyncpg.Connection, jobs: list[ClaimedEvent], outcomes: list[Outcome | None],
                         ran: list[int]) -> None:
        """Open the next job's savepoint; if the last handler left the transaction aborted, it
        fails alone first."""
        try:
            await conn.execute(f"SAVEPOINT {savepoint_name(len(ran))}")
        except asyncpg.InFailedSQLTransactionError:
            await self._aborted_by_last(conn, jobs, outcomes, ran)
            await conn.execute(f"SAVEPOINT {savepoint_name(len(ran))}")

    async def _aborted_by_last(self, conn: asyncpg.Connection, jobs: list[ClaimedEvent], outcomes: list[Outcome | None],
                               ran: list[int]) -> None:
        """The transaction is aborted though every handler returned: the last one to run caught an
        error of its own statement (each earlier one was checked by the savepoint after it). That
        job is rolled back to its savepoint and fails, not its batch-mates."""
        last = ran[-1]
        outcomes[last] = await self._failed_in_savepoint(
            conn, jobs[last], savepoint_name(len(ran) - 1), AbortedByHandler(
                "the handler returned with its transaction aborted: one of its statements failed and the error "
                "was caught instead of raised"))

    async def _complete(self, conn: asyncpg.Connection, jobs: list[ClaimedEvent], outcomes: list[Outcome | None],
                        ran: list[int]) -> None:
        """One guarded completion for every job of the batch whose effect applied. A job whose lease
        is gone (another worker owns it now) is cut off at its savepoint with everything after it:
        it is LOST, the jobs after it are handed back unrun (None), and those before it complete."""
        while True:
            applied = [i for i in ran if outcomes[i] == DONE]
            if not applied:
                return
            try:
                done = await self._completer.complete(conn, [(jobs[i].event.id, jobs[i].event.attempts)
                                                             for i in applied])
            except asyncpg.InFailedSQLTransactionError:
                await self._aborted_by_last(conn, jobs, outcomes, ran)
                continue
            lost = next((p for p, i in enumerate(ran) if outcomes[i] == DONE and jobs[i].event.id not in done), None)
            if lost is None:
                return
            await conn.execute(f"ROLLBACK TO SAVEPOINT {savepoint_name(lost)}")
            outcomes[ran[lost]] = LOST
            for i in ran[lost + 1:]:
                outcomes[i] = None
            del ran[lost:]

    def _record_pace(self, seconds: float, jobs: int = 1) -> None:
        """``jobs`` ran in ``seconds``, their commit not counted (a job alone counts too: a slow
        moment, such as a cold pool, must not pin the limit at one job for good, as it would if
        only batches of several measured the pace)."""
        self._job_seconds = 0.7 * self._job_seconds + 0.3 * seconds / jobs


class Processor:
    def __init__(self, pool: asyncpg.Pool, session: WebhookClient, worker_id: str,
                 complete_later: Callable[[int, int], Awaitable[bool]],
                 effect_done: Callable[[int], None] = lambda _id: None, *, concurrency: int = 16,
                 batch_seconds: float = 0.05) -> None:
        self.pool = pool
        self.session = session
        self.worker_id = worker_id
        self.completer = Completer(worker_id, complete_later)
        self.effects = Effects(session, self.completer)
        self.imports = HandlerImports(pool, worker_id)
        self._effect_done = effect_done
        # As many transactions as events may run at once (slow handlers run side by side);
        # under a backlog of fast ones, they share a few commits instead of each paying for one.
        self._concurrency = max(1, concurrency)
        self._batch_seconds = batch_seconds
        self._batches: dict[str, TransactionBatches] = {}

    async def stop(self, timeout: float = 5.0) -> None:
        """Let running batches commit (their callers are gone or done); cut them off after ``timeout``."""
        batches, self._batches = list(self._batches.values()), {}
        await asyncio.gather(*(b.stop(timeout) for b in batches), self.imports.stop())

    def waiting(self, provider: Provider) -> bool:
        """True while nothing of ``provider``'s should be claimed: its handler does not import."""
        return self.imports.waiting(provider)

    async def process(self, event: Event, provider: Provider, deferred_since: float | None, *,
                      alone: bool = False) -> Result:
        """Run ``event`` and book its outcome. ``alone``: never in a batch (a suspect, which may
        be what crashed its last worker, must not share a transaction with anything)."""
        started = time.perf_counter()
        outcome = await self._attempt(ClaimedEvent(event, provider, find_transition(provider, event.event_type),
                                                   deferred_since), alone)
        if outcome.result is Result.DEAD and outcome.error is not None:
            log.warning("event dead", extra={"provider": event.provider, "event_id": event.event_id,
                                             "attempts": event.attempts, "error": outcome.error[:300]})
        metrics.child(metrics.handler_duration, event.provider).observe(time.perf_counter() - started)
        metrics.child(metrics.worker_events, event.provider, outcome.result.value).inc()
        return outcome.result

    async def _attempt(self, job: ClaimedEvent, alone: bool) -> Outcome:
        event, provider = job.event, job.provider
        if job.transition is not None and event.entity_key is None:
            assert provider.ordering is not None
            return await self.completer.fail(self.pool, event, provider, PermanentFailure(
                f"no entity key at {provider.ordering.entity_key.describe()}"))
        transactional = False
        if provider.handler:
            handler = await self.imports.load(provider, provider.handler)
            if isinstance(handler, str):
                return await self.completer.put_back(self.pool, event, HandlerImports.RECHECK_SECONDS,
                                                     f"handler {provider.handler} cannot be imported: {handler}")
            transactional = handler.transactional
        if transactional or job.transition is not None:
            return await self._batches_of(provider).run(job, alone=alone or not transactional)
        failure = await caught(self.effects.run(event, provider, None))
        if failure is not None:
            return await self.completer.fail(self.pool, event, provider, failure)
        self._effect_done(event.id)
        result = await self.completer.complete_later(event, provider)
        return DONE if result is Result.DONE else Outcome(result)

    def _batches_of(self, provider: Provider) -> TransactionBatches:
        if provider.name not in self._batches:
            self._batches[provider.name] = TransactionBatches(
                self.effects, self.completer, self.pool, provider.name,
                transactions=self._concurrency, max_batch=min(self._concurrency, TransactionBatches.MAX_JOBS),
                max_seconds=self._batch_seconds)
        return self._batches[provider.name]
