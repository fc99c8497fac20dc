"""Debian's Postgres engines beside the embedded one (``make engines``, tests/engines/install.sh):
Postgres 15, pg_auto_failover and PgBouncer. A test that needs a missing one is skipped, or fails
where the run requires it (CI: HOOKLINE_REQUIRE_ENGINES=1)."""

from __future__ import annotations

from pathlib import Path

from support.tools import unavailable

POSTGRES_15 = Path("/usr/lib/postgresql/15")
PG_AUTOCTL = Path("/usr/bin/pg_autoctl")
PGBOUNCER = Path("/usr/sbin/pgbouncer")
REQUIRED_BY = "HOOKLINE_REQUIRE_ENGINES"


def postgres_15() -> Path:
    """Debian's Postgres 15 installation (bin/, lib/), for EmbeddedPostgres(install=...)."""
    if not (POSTGRES_15 / "bin" / "postgres").exists():
        unavailable("Debian's postgresql-15 is not installed (make engines)", REQUIRED_BY)
    return POSTGRES_15


def pg_autoctl() -> Path:
    if not PG_AUTOCTL.exists() or not (POSTGRES_15 / "lib" / "pgautofailover.so").exists():
        unavailable("pg_auto_failover is not installed (make engines)", REQUIRED_BY)
    return PG_AUTOCTL


def pgbouncer() -> Path:
    if not PGBOUNCER.exists():
        unavailable("pgbouncer is not installed (make engines)", REQUIRED_BY)
    return PGBOUNCER
