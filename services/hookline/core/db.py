"""The thin connector layer: connection pools and SQL loaded by name.

SQL lives in ``sql/queries.sql`` (one ``-- name: <query>`` block per statement) so
that it can be read, reviewed and EXPLAINed as SQL rather than as Python strings.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from typing import Any

import asyncpg

from hookline.core.config import database_url

_QUERY_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    parts = _QUERY_HEADER.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


@functools.cache
def _queries(filename: str = "queries.sql") -> dict[str, str]:
    text = importlib.resources.files("hookline.core").joinpath(f"sql/{filename}").read_text()
    return parse_queries(text)


def query(name: str, filename: str = "queries.sql") -> str:
    """The SQL text of the named query from ``sql/<filename>`` (``sql/queries.sql`` by default)."""
    try:
        return _queries(filename)[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in hookline/core/sql/{filename}") from None


async def _init_connection(conn: asyncpg.Connection) -> None:
    # JSON columns come back as Python objects rather than strings.
    for typ in ("json", "jsonb"):
        await conn.set_type_codec(
            typ, schema="pg_catalog", encoder=_json_dumps, decoder=_json_loads, format="text"
        )


def _json_dumps(value: Any) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


def _json_loads(value: str) -> Any:
    import json

    return json.loads(value)


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Skip asyncpg's reset query on release (it still aborts open transactions and drops listeners)."""


async def create_pool(
    url: str | None = None, *, min_size: int = 1, max_size: int = 10, command_timeout: float = 30.0,
    lean: bool = False,
) -> asyncpg.Pool:
    """A pool with Hookline's type codecs; ``url`` defaults to HOOKLINE_DATABASE_URL.

    ``lean`` pools skip the per-release ``RESET ALL; UNLISTEN *; ...`` round trip, which
    costs a service as much as the statement it runs. Code on such a pool (handlers
    included) must not leave session state behind: use ``SET LOCAL``, not ``SET``.
    """
    pool = await asyncpg.create_pool(
        url or database_url(),
        min_size=min_size,
        max_size=max_size,
        command_timeout=command_timeout,
        init=_init_connection,
        **({"reset": _keep_session} if lean else {}),
    )
    assert pool is not None
    return pool


async def connect(url: str | None = None) -> asyncpg.Connection:
    """A single connection (for LISTEN, migrations and one-shot commands)."""
    conn = await asyncpg.connect(url or database_url())
    await _init_connection(conn)
    return conn
