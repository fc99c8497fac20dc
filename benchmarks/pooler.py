"""python -m benchmarks.pooler: a worker drain direct to Postgres vs through PgBouncer in transaction mode.

Through a transaction-mode pooler the pools run with asyncpg's statement cache off and without the
generic-plan settings (core/db.py create_pool, transaction_pooling): every statement is parsed and
planned at each execution, and each passes through one more process. This measures what that costs
on one drain of preloaded no-op events, the one-parameter handler (batched completions) and the
``(event, conn)`` one (a transaction per event), alternating direct and pooled runs, each on fresh
rows, on one embedded Postgres and Debian's PgBouncer (1.18: no protocol-level prepared statements,
which need >= 1.21, so the cache-on-through-PgBouncer variant cannot be measured here).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.common import BenchDatabase, checkpoint
from benchmarks.worker import run_hookline

REPO = Path(__file__).resolve().parent.parent


def providers(rounds: int) -> str:
    return "".join(f"""
---
kind: WebhookProvider
metadata: {{name: {name}-{mode}-{n}}}
spec:
  signature: {{scheme: none}}
  handler: "benchmarks.handlers:{handler}"
""" for n in range(rounds) for mode in ("direct", "pooled") for name, handler in (("noop", "noop"), ("tx", "noop_tx")))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=40, help="PgBouncer's default_pool_size")
    args = parser.parse_args()
    args.worker_args, args.budget = "", 300.0
    sys.path.insert(0, str(REPO / "tests"))  # the tests' PgBouncer helper, one way to run one
    from hookline.core import db
    from hookline.core.providers import apply_providers
    from support.pgbouncer import PgBouncer

    database = BenchDatabase()
    url = await database.start()
    work = Path(tempfile.mkdtemp(prefix="hookline-bench-pooler-"))
    rates: dict[str, list[float]] = {}
    try:
        with PgBouncer(database.server.url, "transaction", pool_size=args.pool_size) as bouncer:
            pooled = bouncer.url_for(url)
            conn = await db.connect(url)
            try:
                await apply_providers(conn, providers(args.rounds))
                for n in range(args.rounds):
                    for mode in ("direct", "pooled"):
                        for name in ("noop", "tx"):
                            if mode == "pooled":
                                os.environ.update(HOOKLINE_DATABASE_POOLING="transaction",
                                                  HOOKLINE_DATABASE_SESSION_URL=url)
                            else:
                                os.environ.pop("HOOKLINE_DATABASE_POOLING", None)
                                os.environ.pop("HOOKLINE_DATABASE_SESSION_URL", None)
                            await checkpoint(url)
                            result = await run_hookline(conn, pooled if mode == "pooled" else url,
                                                        f"{name}-{mode}-{n}", args, work)
                            rate = result.jobs / (result.clock_seconds or result.seconds)
                            rates.setdefault(f"{name} {mode}", []).append(rate)
                            print(f"round {n + 1} {name:4} {mode:6}: {rate:8,.0f} events/s", flush=True)
            finally:
                await conn.close()
    finally:
        database.stop()
    for name in ("noop", "tx"):
        direct, pooled_rates = (sum(rates[f"{name} {m}"]) / args.rounds for m in ("direct", "pooled"))
        print(f"{name:4}: direct {direct:8,.0f}/s  pgbouncer transaction mode {pooled_rates:8,.0f}/s  "
              f"ratio {pooled_rates / direct:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
