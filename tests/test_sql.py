"""Every ``core/sql/*.sql`` file is valid SQL that Postgres plans: each statement as written
(the template defaults), and each queue statement as rendered for the inbox and the outbox,
EXPLAINed against the migrated schema. The claims read their partial indexes."""

from __future__ import annotations

import datetime
import importlib.resources
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from hookline.core import db
from support.queues import QUEUES, QueueCase

# schema.sql is the whole schema for reading (tests/test_schema_file.py), not named statements.
SQL_FILES = sorted(f.name for f in importlib.resources.files("hookline.core").joinpath("sql").iterdir()
                   if f.name.endswith(".sql") and f.name != "schema.sql")

# asyncpg sends statements with the extended protocol, which binds $n to values; EXPLAIN
# (GENERIC_PLAN) must get the statement as plain text with its $n unbound, as EXECUTE does.
GENERIC_PLAN = """
CREATE FUNCTION pg_temp.generic_plan(statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE plan text;
BEGIN
    EXECUTE 'EXPLAIN (GENERIC_PLAN, FORMAT JSON) ' || statement INTO plan;
    RETURN plan;
END $$;
"""

# Tables shaped like a queue that has been running: mostly finished rows, a few due. The
# inbox's rows are spread over four of its time partitions (migration 0011), the outbox's
# events and their deliveries over four of theirs (migration 0018).
RUNNING_QUEUES = """
INSERT INTO hookline.inbox (provider, event_id, body, status, entity_key, received_at)
SELECT 'p' || g % 10, 'evt_' || g, '\\x'::bytea, CASE WHEN g % 100 = 0 THEN 'pending' ELSE 'done' END, 'k' || g % 50,
       now() + (g % 4) * interval '1 day'
FROM generate_series(1, 20000) AS g;
INSERT INTO hookline.endpoints (name, url) SELECT 'p' || g, 'https://example.com/hook' FROM generate_series(0, 9) AS g;
INSERT INTO hookline.outbox (event_id, event_type, payload, created_at)
SELECT 'msg_' || g, 't', '{}', now() + (g % 4) * interval '1 day' FROM generate_series(1, 20000) AS g;
INSERT INTO hookline.deliveries (outbox_id, endpoint, status, aggregate_key, created_at)
SELECT id, 'p' || id % 10, CASE WHEN id % 100 = 0 THEN 'pending' ELSE 'done' END, 'k' || id % 50, created_at
FROM hookline.outbox;
ANALYZE;
"""


@pytest.fixture
async def planner(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    try:
        if conn.get_server_version().major < 16:
            pytest.skip("EXPLAIN (GENERIC_PLAN) needs PostgreSQL 16 or later")
        await conn.execute(GENERIC_PLAN)
        await conn.execute(RUNNING_QUEUES)
        yield conn
    finally:
        await conn.close()


async def explain(conn: asyncpg.Connection, sql: str, where: str) -> list[dict[str, Any]]:
    try:
        plan: list[dict[str, Any]] = json.loads(await conn.fetchval("SELECT pg_temp.generic_plan($1)", sql))
    except asyncpg.PostgresError as exc:
        raise AssertionError(f"{where} does not plan: {exc}\n{sql}") from None
    return plan


def nodes(plan: object) -> list[dict[str, Any]]:
    """Every plan node, depth first."""
    if isinstance(plan, list):
        return [n for item in plan for n in nodes(item)]
    if not isinstance(plan, dict):
        return []
    found = [plan] if "Node Type" in plan else []
    return found + [n for value in plan.values() if isinstance(value, (list, dict)) for n in nodes(value)]


def is_ddl(sql: str) -> bool:
    """Statements EXPLAIN cannot plan (CREATE ..., LOCK, SET); they are run and rolled back instead."""
    code = " ".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return code.split(None, 1)[0].upper() in ("CREATE", "ALTER", "DROP", "LOCK", "SET")


async def test_every_statement_as_written_plans(planner: asyncpg.Connection) -> None:
    planned = 0
    for filename in SQL_FILES:
        statements = db.statements(filename)
        assert statements, f"{filename} has no '-- name:' statements"
        for name, sql in statements.items():
            if is_ddl(sql):
                tx = planner.transaction()
                await tx.start()
                try:
                    await planner.execute(sql)
                finally:
                    await tx.rollback()
            else:
                await explain(planner, sql, f"{name} in {filename}")
                planned += 1
    assert planned > 50


@pytest.mark.parametrize("case", QUEUES, ids=[q.name for q in QUEUES])
async def test_every_queue_statement_plans_as_rendered(planner: asyncpg.Connection, case: QueueCase) -> None:
    rendered = case.queue.statements()
    other_tables = {q.queue.table for q in QUEUES} - {case.queue.table}
    assert set(db.statements("queue.sql")) <= set(rendered)
    for name, sql in rendered.items():
        assert "TEMPLATE" not in sql, f"{name} for the {case.name} kept a template marker"
        assert not any(t in sql for t in other_tables), f"{name} for the {case.name} names another queue's table"
        await explain(planner, sql, f"{name} for the {case.name}")


CLAIM_INDEXES = {
    ("inbox", "claim"): {"inbox_claimable_idx"},
    ("inbox", "claim_suspect"): {"inbox_suspect_idx"},
    # Due retries first, through their own partial index; then first attempts.
    ("outbox", "claim"): {"deliveries_retry_idx", "deliveries_claimable_idx"},
    ("outbox", "claim_ordered"): {"deliveries_retry_idx", "deliveries_claimable_idx",
                                  "deliveries_unfinished_aggregate_idx"},
    ("outbox", "claim_suspect"): {"deliveries_suspect_idx"},
}


async def partitioned_indexes(conn: asyncpg.Connection, names: set[str]) -> set[str]:
    """The indexes as declared: a partition's index by the partitioned index it belongs to."""
    rows = await conn.fetch("SELECT coalesce(pg_partition_root(r), r)::regclass::text AS root"
                            " FROM unnest($1::text[]) AS n, to_regclass('hookline.' || n) AS r", list(names))
    return {r["root"].removeprefix("hookline.") for r in rows}


async def nonempty(conn: asyncpg.Connection, relations: set[str]) -> set[str]:
    """Relations with pages: reading an empty partition (the inbox's default) whole costs nothing."""
    rows = await conn.fetch("SELECT relname FROM pg_class WHERE relname = ANY($1::text[]) AND relpages > 0",
                            list(relations))
    return {r["relname"] for r in rows}


@pytest.mark.parametrize(("queue", "statement"), sorted(CLAIM_INDEXES))
async def test_claims_read_their_partial_indexes(planner: asyncpg.Connection, queue: str, statement: str) -> None:
    case = next(q for q in QUEUES if q.name == queue)
    plan = nodes(await explain(planner, case.queue.sql(statement), f"{statement} for the {queue}"))
    used = await partitioned_indexes(planner, {n["Index Name"] for n in plan if "Index Name" in n})
    assert CLAIM_INDEXES[queue, statement] <= used, f"{statement} for the {queue} uses {used}"
    scanned = await nonempty(planner, {n["Relation Name"] for n in plan if n["Node Type"] == "Seq Scan"})
    assert not scanned, f"{statement} for the {queue} reads whole tables: {scanned}"


def test_templates_render_sections_and_markers() -> None:
    sql = ("SELECT /* TEMPLATE: column */provider FROM /* TEMPLATE: table */hookline.inbox WHERE true"
           "/* TEMPLATE_BEGIN: recent */ AND received_at > now() - interval '1 day'"
           "/* TEMPLATE_BEGIN: mine */ AND locked_by = $1/* TEMPLATE_END *//* TEMPLATE_END */")
    values: dict[str, db.TemplateValue] = {"column": "endpoint", "table": "hookline.deliveries",
                                           "recent": True, "mine": False}
    assert db.render(sql, values) == ("SELECT endpoint FROM hookline.deliveries WHERE true"
                                      " AND received_at > now() - interval '1 day'")
    assert db.render(sql, {**values, "recent": False, "mine": True}) == (
        "SELECT endpoint FROM hookline.deliveries WHERE true")
    assert db.render("SELECT pg_notify(/* TEMPLATE: channel */'a', '')", {"channel": "'b'"}) == (
        "SELECT pg_notify('b', '')")


@pytest.mark.parametrize(("sql", "values", "error", "message"), [
    ("SELECT /* TEMPLATE: table */t", {}, KeyError, "needs the template value 'table'"),
    ("SELECT /* TEMPLATE: table */t", {"table": "t; DROP TABLE x"}, ValueError, "not an identifier"),
    ("SELECT /* TEMPLATE: table */t", {"table": True}, ValueError, "not an identifier"),
    ("SELECT 1/* TEMPLATE_BEGIN: extra */, 2/* TEMPLATE_END */", {"extra": "yes"}, TypeError, "true or false"),
    ("SELECT /* TEMPLATE:table */t", {"table": "u"}, ValueError, "malformed"),
    ("SELECT 1/* TEMPLATE_BEGIN: extra */, 2", {"extra": True}, ValueError, "malformed"),
])
def test_template_mistakes_fail_clearly(sql: str, values: dict[str, db.TemplateValue], error: type[Exception],
                                        message: str) -> None:
    with pytest.raises(error, match=message):
        db.render(sql, values)


def test_unknown_statement_names_its_file() -> None:
    with pytest.raises(KeyError, match=r"no query named 'nope' in hookline/core/sql/queue\.sql"):
        db.query("nope", "queue.sql")


# The inbox is partitioned by received_at (migration 0011), the deliveries by their event's
# created_at (0018), and these statements find rows by id or status, not by time, so every
# partition is probed; what must hold is that each probe is an index read (the primary key, or
# a partial index), never a read of a whole partition.
PARTITIONED_STATEMENT_INDEXES = {
    # Picks through the claimable index, then updates the picked rows by primary key.
    ("inbox", "claim"): {"inbox_claimable_idx", "inbox_pkey"},
    # By id, through the primary key only: the leased index holds the dead entries of every row
    # completed since the last vacuum (see "By id" in queue.sql).
    ("inbox", "extend_leases"): {"inbox_pkey"},
    ("inbox", "complete"): {"inbox_pkey"},
    ("inbox", "lock_expired"): {"inbox_leased_idx"},
    # The same for the deliveries; the claim takes due retries first through their own index.
    ("outbox", "claim"): {"deliveries_retry_idx", "deliveries_claimable_idx", "deliveries_pkey"},
    ("outbox", "extend_leases"): {"deliveries_pkey"},
    ("outbox", "complete"): {"deliveries_pkey"},
    ("outbox", "lock_expired"): {"deliveries_leased_idx"},
}
PARTITIONED_TABLES = {"inbox": "hookline.inbox", "outbox": "hookline.deliveries"}


@pytest.mark.parametrize(("queue", "statement"), sorted(PARTITIONED_STATEMENT_INDEXES))
async def test_queue_statements_keep_their_plans_on_partitioned_tables(planner: asyncpg.Connection, queue: str,
                                                                       statement: str) -> None:
    partitions = await planner.fetchval(f"SELECT count(DISTINCT tableoid) FROM {PARTITIONED_TABLES[queue]}")
    assert partitions >= 4
    case = next(q for q in QUEUES if q.name == queue)
    plan = nodes(await explain(planner, case.queue.sql(statement), f"{statement} for the {queue}"))
    read = [n["Index Name"] for n in plan if "Index Name" in n]
    assert len(read) >= partitions, f"{statement} does not read each partition's index: {read}"
    used = await partitioned_indexes(planner, set(read))
    assert used and used <= PARTITIONED_STATEMENT_INDEXES[queue, statement], f"{statement} uses {used}"
    scanned = await nonempty(planner, {n["Relation Name"] for n in plan if n["Node Type"] == "Seq Scan"})
    assert not scanned, f"{statement} reads whole partitions: {scanned}"


# The relay's and `hookline status`'s per-endpoint figures read the indexes of unfinished and
# dead deliveries, never the delivered history (which is almost all of the table).
ENDPOINT_STATS = [("outbox.sql", "undelivered_age"), ("status.sql", "endpoint_status"), ("queue.sql", "stats")]


@pytest.mark.parametrize(("filename", "statement"), ENDPOINT_STATS)
async def test_endpoint_statistics_read_indexes_only(planner: asyncpg.Connection, filename: str,
                                                     statement: str) -> None:
    outbox_queue = next(q for q in QUEUES if q.name == "outbox").queue
    sql = outbox_queue.sql(statement) if filename == "queue.sql" else db.query(statement, filename)
    plan = nodes(await explain(planner, sql, statement))
    scanned = await nonempty(planner, {n["Relation Name"] for n in plan if n["Node Type"] == "Seq Scan"})
    assert not {name for name in scanned if name.startswith("deliveries")}, f"{statement} reads {scanned}"
    used = await partitioned_indexes(planner, {n["Index Name"] for n in plan if "Index Name" in n})
    assert used & {"deliveries_undelivered_idx", "deliveries_claimable_idx", "deliveries_parked_idx",
                   "deliveries_dead_idx"}, f"{statement} uses {used}"


async def test_one_event_by_its_id_is_an_index_probe_per_partition(planner: asyncpg.Connection) -> None:
    sql = "SELECT id FROM hookline.inbox WHERE provider = $1 AND event_id = $2"
    plan = nodes(await explain(planner, sql, "an inbox event by (provider, event_id)"))
    assert await partitioned_indexes(planner, {n["Index Name"] for n in plan if "Index Name" in n}) == {
        "inbox_event_idx"}
    assert not await nonempty(planner, {n["Relation Name"] for n in plan if n["Node Type"] == "Seq Scan"})


def test_a_claim_goes_only_into_its_own_queues_stand_in() -> None:
    from hookline.core.queue import INBOX, OUTBOX

    wrapper = "WITH claimed AS (\n    SELECT * FROM hookline.inbox WHERE false\n)\nSELECT id FROM claimed;"
    composed = INBOX.claim_within(wrapper)
    assert "WHERE false" not in composed and INBOX.sql("claim").rstrip().removesuffix(";") in composed
    with pytest.raises(ValueError, match=r"hookline\.deliveries WHERE false' once"):
        OUTBOX.claim_within(wrapper)  # the outbox's claim never lands in a statement written for the inbox
    with pytest.raises(ValueError, match="once"):
        INBOX.claim_within(wrapper.replace("SELECT id FROM claimed", "SELECT * FROM hookline.inbox WHERE false"))


# --- Claims whose plan does not depend on when ANALYZE ran (migration 0028) ---------------------------

# A queue that ANALYZE saw drained (every row done), and then a burst: the share of pending rows the
# statistics knew of (none) is not what the claim meets (every newest row).
DRAINED_THEN_BURST = {
    "inbox": ("INSERT INTO hookline.inbox (provider, event_id, body, status) SELECT 'p', 'evt_' || g, '\\x'::bytea, "
              "'done' FROM generate_series(1, $1::int) AS g",
              "INSERT INTO hookline.inbox (provider, event_id, body) SELECT 'p', 'new_' || g, '\\x'::bytea "
              "FROM generate_series(1, $1::int) AS g"),
    "outbox": ("WITH e AS (INSERT INTO hookline.outbox (event_id, event_type, payload) SELECT 'msg_' || g, 't', '{}' "
               "FROM generate_series(1, $1::int) AS g RETURNING id, created_at) INSERT INTO hookline.deliveries "
               "(outbox_id, endpoint, status, created_at) SELECT id, 'p', 'done', created_at FROM e",
               "WITH e AS (INSERT INTO hookline.outbox (event_id, event_type, payload) SELECT 'new_' || g, 't', '{}' "
               "FROM generate_series(1, $1::int) AS g RETURNING id, created_at) INSERT INTO hookline.deliveries "
               "(outbox_id, endpoint, created_at) SELECT id, 'p', created_at FROM e"),
}


async def claim_sorts_every_pending_row(conn: asyncpg.Connection, case: QueueCase) -> bool:
    """Whether the claim's generic plan sorts what the claimable index returns instead of reading it
    in order (a Merge Append of the partitions' ordered index scans) and stopping at the limit."""
    plan = nodes(await explain(conn, case.queue.sql("claim"), f"claim for the {case.name}"))
    return any(n["Node Type"] in ("Sort", "Incremental Sort") for n in plan)


@pytest.mark.parametrize("case", QUEUES, ids=[q.name for q in QUEUES])
async def test_a_claim_after_an_analyze_of_a_drained_queue_reads_its_index_in_order(
        database_url: str, case: QueueCase) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        if conn.get_server_version().major < 16:
            pytest.skip("EXPLAIN (GENERIC_PLAN) needs PostgreSQL 16 or later")
        await conn.execute(GENERIC_PLAN)
        await conn.execute("INSERT INTO hookline.endpoints (name, url) VALUES ('p', 'https://example.com/hook')")
        done, burst = DRAINED_THEN_BURST[case.name]
        await conn.execute(done, 200_000)
        await conn.execute(f"VACUUM ANALYZE {case.queue.table}")
        await conn.execute(burst, 20_000)
        assert not await claim_sorts_every_pending_row(conn, case)
        # What migration 0028 prevents: with the statistics of that ANALYZE (status; the deliveries'
        # attempts, which picks their due retries) the planner expects a row or so and sorts them all.
        for column in ("status", "attempts"):
            await conn.execute(f"ALTER TABLE {case.queue.table} ALTER COLUMN {column} SET STATISTICS -1")
        await conn.execute(f"DELETE FROM {case.queue.table} WHERE status = 'pending'")
        await conn.execute(f"ANALYZE {case.queue.table}")
        await conn.execute(burst.replace("'new_'", "'again_'"), 20_000)
        assert await claim_sorts_every_pending_row(conn, case)
    finally:
        await conn.close()


async def test_new_partitions_take_their_parents_zero_statistics_targets(pool: asyncpg.Pool) -> None:
    # Hourly partitions for a week: those past the daily ones the migrations made are new.
    await pool.execute(db.query("set_partition_width", "partitions.sql"), "hookline.inbox",
                       datetime.timedelta(hours=1), 168)
    await pool.execute(db.query("set_outbox_partition_width", "partitions.sql"), datetime.timedelta(hours=1), 168)
    created = [name for table in ("hookline.inbox", "hookline.deliveries", "hookline.outbox")
               for name in await pool.fetchval("SELECT array_agg(n) FROM hookline.ensure_partitions($1) AS n", table)]
    assert len(created) > 3 * 48
    zero = await pool.fetch("SELECT c.relname AS rel, a.attname AS col FROM pg_attribute AS a JOIN pg_class AS c "
                            "ON c.oid = a.attrelid WHERE c.oid = ANY($1::regclass[]) AND a.attnum > 0 "
                            "AND a.attstattarget = 0",  # user columns: before 17 system ones have 0 too
                            created)
    by_table: dict[str, set[str]] = {}
    for r in zero:
        by_table.setdefault(r["rel"].split("_p")[0], set()).add(r["col"])
    # As the parents have them (migration 0028); the outbox's events have no such columns.
    assert by_table == {"inbox": {"status"}, "deliveries": {"status", "attempts"}}
    assert len(zero) == sum(1 if "inbox_p" in n else 2 if "deliveries_p" in n else 0 for n in created)


async def generic_claim_plan_after_filling(conn: asyncpg.Connection, case: QueueCase) -> list[dict[str, Any]]:
    """The claim's generic plan made while today's partition was empty (vacuumed so), as a pool's
    connection caches it, then run on the partition filled with 20,000 pending rows."""
    burst = DRAINED_THEN_BURST[case.name][1]
    await conn.execute("INSERT INTO hookline.endpoints (name, url) VALUES ('p', 'https://example.com/hook')")
    await conn.execute(f"VACUUM ANALYZE {case.queue.table}")
    params = "text, int, text, float8, timestamptz"
    await conn.execute(f"PREPARE claim_now ({params}) AS {case.queue.sql('claim')}")
    await conn.execute("BEGIN")
    await conn.execute("EXECUTE claim_now('p', 32, 'w', 30, NULL)")  # planned here, on the empty table
    await conn.execute("ROLLBACK")
    await conn.execute(burst, 20_000)
    await conn.execute("BEGIN")
    try:
        explain_it = "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim_now('p', 32, 'w', 30, NULL)"
        plan = json.loads(await conn.fetchval("SELECT pg_temp.explain_cached($1)", explain_it))
    finally:
        await conn.execute("ROLLBACK")
    return nodes(plan)


EXPLAIN_CACHED = """
CREATE FUNCTION pg_temp.explain_cached(statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE plan text;
BEGIN
    EXECUTE statement INTO plan;
    RETURN plan;
END $$;
"""


@pytest.mark.parametrize("case", QUEUES, ids=[q.name for q in QUEUES])
@pytest.mark.parametrize("pool_settings", [True, False], ids=["pool-settings", "without"])
async def test_a_generic_plan_made_on_an_empty_partition_stays_an_index_read_as_it_fills(
        database_url: str, case: QueueCase, pool_settings: bool) -> None:
    # What the worker's and the relay's pools set (db.GENERIC_PLAN_SETTINGS); without the planner
    # settings (plan_cache_mode alone, as before issue 26) the plan read the whole partition and sorted.
    settings = {name: value for name, (value, _) in db.GENERIC_PLAN_SETTINGS.items()
                if pool_settings or name == "plan_cache_mode"}
    conn = await asyncpg.connect(database_url, server_settings=settings)
    try:
        await conn.execute(EXPLAIN_CACHED)
        plan = await generic_claim_plan_after_filling(conn, case)
    finally:
        await conn.close()
    # A sequential scan that met rows (returned or filtered out): the filled partition read whole.
    today = {n["Relation Name"] for n in plan if n["Node Type"] == "Seq Scan"
             and n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0) > 0}
    sorts = [n for n in plan if n["Node Type"] == "Sort"]
    if pool_settings:
        assert not today and not sorts, f"the claim read a filled partition whole: {today}, sorts {len(sorts)}"
    else:
        assert today or sorts, "without the pool's planner settings the plan was expected to read it whole"
