"""The ``hookline`` command: one program, one subcommand per service or task."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from hookline import __version__
from hookline.core import logs
from hookline.core.config import ConfigError

EPILOG = """\
Every command reads HOOKLINE_DATABASE_URL (a postgresql:// URL), except `dev`,
which runs its own embedded Postgres. Logs are JSON lines unless
HOOKLINE_LOG_FORMAT=text.

Start here:  hookline dev            (the whole stack on your machine)
"""


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING or ERROR")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hookline",
        description="Webhook infrastructure on PostgreSQL: no event lost, one business effect per event.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"hookline {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("dev", help="the whole stack in one process on an embedded Postgres",
                       description="Run receiver, worker, relay and lease sweeper in one process on an "
                       "embedded Postgres kept in --data-dir. Prints the receiver URL, the database URL "
                       "and a signed curl example. Ctrl-C stops everything.")
    p.add_argument("--port", type=int, default=8080, help="receiver port (default 8080)")
    p.add_argument("--host", default="127.0.0.1", help="receiver address (default 127.0.0.1)")
    p.add_argument("--providers", type=Path, help="providers YAML file (default: a built-in example)")
    p.add_argument("--data-dir", type=Path, default=Path(".hookline"), help="where Postgres keeps its data")
    _add_common(p)

    p = sub.add_parser("migrate", help="apply schema migrations (idempotent, safe to run concurrently)")
    _add_common(p)

    p = sub.add_parser("receiver", help="the ingest HTTP service")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--max-batch", type=int, default=128, help="most events stored per transaction")
    p.add_argument("--batch-window-ms", type=float, default=1.0,
                   help="how long a batch waits for more events (default 1 ms)")
    p.add_argument("--db-connections", type=int, default=4, help="connections writing batches in parallel")
    _add_common(p)

    p = sub.add_parser("providers", help="manage providers without Kubernetes")
    psub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    pa = psub.add_parser("apply", help="create or update providers from a YAML file")
    pa.add_argument("-f", "--filename", type=Path, required=True,
                    help="YAML file with one or more WebhookProvider documents ('-' for stdin)")
    _add_common(pa)
    pl = psub.add_parser("list", help="list providers (never shows secrets)")
    _add_common(pl)
    pd = psub.add_parser("delete", help="delete a provider (its stored events stay)")
    pd.add_argument("name")
    _add_common(pd)
    return parser


def _run(coro_fn: Callable[..., Coroutine[Any, Any, int | None]], *args: Any) -> int:
    try:
        return asyncio.run(coro_fn(*args)) or 0
    except ConfigError as exc:
        print(f"hookline: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logs.setup(getattr(args, "log_level", None))
    from hookline import commands

    handler = {
        "dev": commands.dev,
        "migrate": commands.migrate,
        "receiver": commands.receiver,
        "providers": commands.providers_cmd,
    }[args.command]
    sys.exit(_run(handler, args))
