"""What each ``hookline`` subcommand does (argument parsing lives in cli.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import asyncpg

from hookline.core import db, migrations, providers
from hookline.core.http import run_until_stopped
from hookline.core.providers import SpecError
from hookline.core.signatures import get_scheme


def _fail(message: str) -> int:
    print(f"hookline: {message}", file=sys.stderr)
    return 2


async def _connect() -> asyncpg.Connection:
    try:
        return await db.connect()
    except (OSError, asyncpg.PostgresError) as exc:
        from hookline.core.config import ConfigError, database_url, redact_url

        raise ConfigError(f"cannot connect to {redact_url(database_url())}: {exc}") from None


async def migrate(args: argparse.Namespace) -> int:
    conn = await _connect()
    try:
        applied = await migrations.migrate(conn)
    finally:
        await conn.close()
    print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return 0


async def apply_providers(conn: asyncpg.Connection, text: str) -> list[str]:
    """Validate every document first, then store them all in one transaction.

    Returns lines to show the user. A document without ``signature.secrets`` keeps the
    provider's stored secrets, or gets a generated one (shown once) when it has none.
    """
    docs = providers.load_documents(text)
    if not docs:
        raise SpecError("the file holds no WebhookProvider documents")
    report: list[str] = []
    async with conn.transaction():
        for name, raw_spec in docs:
            spec, secrets = providers.split_file_secrets(raw_spec)
            scheme = spec.get("signature", {}).get("scheme") if isinstance(spec.get("signature"), dict) else None
            if secrets is None:
                existing = await conn.fetchval(db.query("get_provider_secrets"), name)
                if existing:
                    stored = list(existing)
                elif scheme in (None, "none"):
                    stored = []
                else:
                    value = get_scheme(scheme).generate_secret()
                    stored = [{"value": value, "notAfter": None}]
                    report.append(f"{name}: generated secret (shown once): {value}")
            else:
                stored = [{"value": s, "notAfter": None} for s in secrets]
            try:
                providers.parse_provider(name, spec, providers.active_secrets(stored))
            except SpecError as exc:
                raise SpecError(f"{name}: {exc}") from None
            await providers.upsert(conn, name, spec, stored)
            report.append(f"provider/{name} applied")
    return report


async def providers_cmd(args: argparse.Namespace) -> int:
    conn = await _connect()
    try:
        if args.action == "apply":
            try:
                text = sys.stdin.read() if str(args.filename) == "-" else args.filename.read_text()
            except OSError as exc:
                return _fail(f"cannot read {args.filename}: {exc.strerror}")
            try:
                for line in await apply_providers(conn, text):
                    print(line)
            except SpecError as exc:
                return _fail(f"{args.filename}: {exc} (nothing was applied)")
        elif args.action == "list":
            rows = await conn.fetch(db.query("list_providers"))
            print(f"{'NAME':<24} {'SCHEME':<18} {'TARGET':<40} SECRETS")
            for row in rows:
                spec: dict[str, Any] = row["spec"]
                target = spec.get("handler") or (spec.get("destination") or {}).get("url") or "-"
                print(f"{row['name']:<24} {spec.get('signature', {}).get('scheme', '?'):<18} "
                      f"{target:<40} {len(providers.active_secrets(row['secrets']))}")
        elif args.action == "delete":
            if not await providers.delete(conn, args.name):
                return _fail(f"no provider named {args.name!r}")
            print(f"provider/{args.name} deleted (its stored events are kept)")
    finally:
        await conn.close()
    return 0


async def receiver(args: argparse.Namespace) -> int:
    from hookline.core.providers import ProviderRegistry
    from hookline.receiver.app import Receiver

    pool = await db.create_pool(max_size=args.db_connections + 2)
    registry = ProviderRegistry(pool)
    await registry.start()
    service = Receiver(pool, registry, args.host, args.port, max_batch=args.max_batch,
                       window=args.batch_window_ms / 1000, flushers=args.db_connections)

    async def stop() -> None:
        await service.stop()
        await registry.stop()
        await pool.close()

    await run_until_stopped(service.start, stop)
    return 0


async def dev(args: argparse.Namespace) -> int:
    from hookline.dev import run_dev

    return await run_dev(args)
