"""Failures you can see (issue 25, points 5 and 6), with real worker processes and the real CLI:
a handler that cannot be imported is a configuration error (said once, shown by `hookline status`,
its events' attempts not counted, and they run once it is fixed); a failing handler's traceback is
kept in the attempt log, bounded, and shown by `hookline events show`."""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg
import pytest

from hookline.worker.completer import ATTEMPT_LOG_BYTES, bounded
from support.inbox import apply_provider, create_effect_tables, insert_events
from support.processes import hookline_cli, worker
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

MISSING = "support.no_such_hooks:on_event"
GOOD = 'signature: {scheme: none}\nhandler: "support.handlers:record_effect"\n' \
       "retry: {maxAttempts: 2, initialDelaySeconds: 0.05, maxDelaySeconds: 0.1}"


async def test_an_unimportable_handler_waits_counts_no_attempt_and_runs_once_fixed(
        pool: asyncpg.Pool, database_url: str, log_dir: Path) -> None:
    await create_effect_tables(pool)
    apply_provider(database_url, "broken", GOOD)
    # The spec as an install that skips `providers apply`'s import check stores it (--no-import-check,
    # the operator): a handler the worker cannot import.
    await pool.execute("UPDATE hookline.providers SET spec = jsonb_set(spec, '{handler}', to_jsonb($1::text)), "
                       "updated_at = now() WHERE name = 'broken'", MISSING)
    await insert_events(pool, "broken", 3)
    proc = worker(database_url, log_dir, "--provider", "broken")
    try:
        # Every event it claimed went back: pending, its attempt not counted, the reason on its row.
        put_back = ("SELECT count(*) FROM hookline.inbox WHERE provider = 'broken' AND status = 'pending' "
                    "AND attempts = 0 AND last_error LIKE 'handler ' || $1 || ' cannot be imported: %'")
        await eventually(lambda: pool.fetchval(put_back, MISSING), equals=3)
        assert await pool.fetchval("SELECT count(*) FROM hookline.attempts WHERE part = 'broken'") == 0
        assert proc.logs().count("handler cannot be imported") == 1, proc.logs()

        status = hookline_cli(database_url, "status")
        assert status.returncode == 1, status.stdout + status.stderr
        [problem] = [line for line in status.stdout.splitlines() if "provider broken:" in line]
        assert f"handler {MISSING} cannot be imported (ModuleNotFoundError: No module named " \
               "'support.no_such_hooks')" in problem
        as_json = json.loads(hookline_cli(database_url, "status", "-o", "json").stdout)
        assert [p["handler_problem"] for p in as_json["providers"] if p["name"] == "broken"] == [
            problem.strip().removeprefix("- provider broken: ")]

        apply_provider(database_url, "broken", GOOD)  # the fix
        await eventually(lambda: pool.fetchval("SELECT count(*) FROM test_effects WHERE provider = 'broken'"),
                         equals=3)
        await eventually(lambda: pool.fetchval("SELECT count(*) FROM hookline.handler_problems"), equals=0)
    finally:
        proc.stop()
    rows = await pool.fetch("SELECT status, attempts, last_error FROM hookline.inbox WHERE provider = 'broken'")
    assert [tuple(r) for r in rows] == [("done", 1, None)] * 3  # one attempt each: none was burned
    assert "provider broken" not in hookline_cli(database_url, "status").stdout
    assert proc.logs().count("handler cannot be imported") == 1
    assert proc.logs().count("handler imports again") == 1


async def test_a_failing_handlers_traceback_is_kept_bounded_and_shown(
        pool: asyncpg.Pool, database_url: str, log_dir: Path) -> None:
    await create_effect_tables(pool)
    apply_provider(database_url, "deep", 'signature: {scheme: none}\nhandler: "support.handlers:fail_deep_down"\n'
                   "retry: {maxAttempts: 2, initialDelaySeconds: 0.05, maxDelaySeconds: 0.1}")
    [event_id] = await insert_events(pool, "deep", 1)
    proc = worker(database_url, log_dir, "--provider", "deep")
    try:
        await eventually(lambda: pool.fetchval("SELECT status FROM hookline.inbox WHERE provider = 'deep'"),
                         equals="dead")
    finally:
        proc.stop()
    # Each failed attempt is one log line with what a person needs.
    [retry_line] = [line for line in proc.logs().splitlines() if "attempt failed; will retry" in line]
    for part in ("deep", event_id, "1 of 2", "next_attempt_at", "ValueError: nothing at the bottom"):
        assert part in retry_line, retry_line

    shown = hookline_cli(database_url, "events", "show", "deep", event_id)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "traceback of attempt 2:" in out
    assert "Traceback (most recent call last):" in out and "in fail_deep_down" in out and "in _further_down" in out
    assert "bytes cut) ..." in out and f"ValueError: nothing at the bottom for {event_id}" in out
    # The table shows each error's first line only.
    table = [line for line in out.splitlines() if line.startswith("    ") and line.split()[:1] in (["1"], ["2"])]
    assert len(table) == 2 and all("ValueError: nothing at the bottom" in line for line in table)

    record = json.loads(hookline_cli(database_url, "events", "show", "deep", event_id, "-o", "json").stdout)
    errors = [a["error"] for a in record["attempt_log"]]
    assert len(errors) == 2 and all(len(e.encode()) <= ATTEMPT_LOG_BYTES for e in errors)
    assert errors[1].startswith("gave up after 2 attempts: ValueError: nothing at the bottom")
    # The event's own row keeps the error alone.
    assert "Traceback" not in record["last_error"]


async def test_bounded_cuts_the_middle_and_says_so() -> None:
    assert bounded("short") == "short"
    text = "first line\n" + "".join(f"frame {i}\n" for i in range(5000)) + "ValueError: the end"
    cut = bounded(text)
    assert len(cut.encode()) <= ATTEMPT_LOG_BYTES
    assert cut.startswith("first line\n") and cut.endswith("ValueError: the end")
    cut_bytes = int(cut.partition("\n... (")[2].partition(" bytes cut)")[0])
    head, _, tail = cut.partition(f"\n... ({cut_bytes} bytes cut) ...\n")
    assert len(head.encode()) + cut_bytes + len(tail.encode()) == len(text.encode())
    wide = "é" * 10_000  # cut between bytes of a character: still text
    assert len(bounded(wide).encode()) <= ATTEMPT_LOG_BYTES


async def test_a_cancellation_the_handler_raises_itself_is_its_events_failure(
        pool: asyncpg.Pool, database_url: str, log_dir: Path) -> None:
    """The one cancellation rule (completer.caught), on every path: in a handler's transaction (alone
    or batched) and outside one. The worker is not stopping, so each event fails, once, and the
    worker goes on."""
    await create_effect_tables(pool)
    once = "\nretry: {maxAttempts: 1}"
    apply_provider(database_url, "cancel-tx", 'signature: {scheme: none}\n'
                   'handler: "support.handlers:cancelled_by_itself"' + once)
    apply_provider(database_url, "cancel-out", 'signature: {scheme: none}\n'
                   'handler: "support.handlers:cancelled_by_itself_outside"' + once)
    await insert_events(pool, "cancel-tx", 5)
    await insert_events(pool, "cancel-out", 2)
    proc = worker(database_url, log_dir)
    try:
        dead = ("SELECT count(*) FROM hookline.inbox WHERE status = 'dead' "
                "AND last_error = 'gave up after 1 attempt: RuntimeError: CancelledError()'")
        await eventually(lambda: pool.fetchval(dead), equals=7)
        assert proc.proc is not None and proc.proc.poll() is None
    finally:
        assert proc.stop() == 0
