"""Inbox helpers for worker tests: tables that record effects, events inserted directly."""

from __future__ import annotations

import json
import uuid

import asyncpg

from support.processes import hookline_cli

EFFECT_TABLES = """
CREATE TABLE test_effects (provider text, event_id text, event_type text, at timestamptz DEFAULT clock_timestamp());
CREATE TABLE test_calls (provider text, event_id text, pid int, at timestamptz DEFAULT clock_timestamp());
"""


async def create_effect_tables(conn: asyncpg.Connection | asyncpg.Pool) -> None:
    await conn.execute(EFFECT_TABLES)


def apply_provider(url: str, name: str, spec_yaml: str) -> None:
    doc = f"kind: WebhookProvider\nmetadata: {{name: {name}}}\nspec:\n" + "\n".join(
        "  " + line for line in spec_yaml.strip("\n").splitlines())
    result = hookline_cli(url, "providers", "apply", "-f", "-", stdin=doc)
    assert result.returncode == 0, result.stderr


async def insert_events(conn: asyncpg.Connection | asyncpg.Pool, provider: str, count: int,
                        event_type: str = "test.event", entity_key: str | None = None) -> list[str]:
    ids = [f"evt_{uuid.uuid4().hex}" for _ in range(count)]
    bodies = [json.dumps({"id": i, "type": event_type}).encode() for i in ids]
    await conn.execute(
        "INSERT INTO hookline.inbox (provider, event_id, event_type, entity_key, body, content_type) "
        "SELECT $1, e, $3, $4, b, 'application/json' FROM unnest($2::text[], $5::bytea[]) AS u(e, b)",
        provider, ids, event_type, entity_key, bodies)
    return ids


async def status_counts(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, int]:
    return {r["status"]: r["n"] for r in await conn.fetch(
        "SELECT status, count(*) AS n FROM hookline.inbox GROUP BY status")}
