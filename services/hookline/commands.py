"""Each ``hookline`` subcommand: its arguments handed to the code that does the work, and the
answer printed (argument parsing lives in cli.py; the domain operations in core/, worker/, relay/)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg

from hookline.core import db, migrations, providers, secrets_at_rest
from hookline.core.config import ConfigError
from hookline.core.providers import SpecError

if TYPE_CHECKING:
    from hookline.relay.egress import EgressConfig


def _fail(message: str) -> int:
    print(f"hookline: {message}", file=sys.stderr)
    return 2


async def _connect() -> asyncpg.Connection:
    try:
        return await db.connect(pinned_search_path=True)
    except db.ConnectionConfigError:
        raise  # its message says it all, URL included
    except db.DATABASE_ERRORS as exc:
        from hookline.core.config import ConfigError, redact_url
        from hookline.core.settings import database_session_url, database_url

        raise ConfigError(f"cannot connect to {redact_url(database_session_url() or database_url())}: {exc}") from None


async def migrate(args: argparse.Namespace) -> int:
    from hookline.core import stored_secrets

    conn = await _connect()
    try:
        applied = await migrations.migrate(conn)
        print("applied: " + ", ".join(applied) if applied else "schema is up to date")
        for warning in (await migrations.public_schema_warning(conn), await migrations.console_role_setup(conn)):
            if warning:
                print(f"hookline: warning: {warning}", file=sys.stderr)
        for line in await stored_secrets.seal_plaintext(conn):
            print(line, file=sys.stderr if line.startswith("warning") else sys.stdout)
    finally:
        await conn.close()
    return 0


async def secrets_cmd(args: argparse.Namespace) -> int:
    from hookline.core import secrets_at_rest, stored_secrets

    ring = secrets_at_rest.required_ring("`hookline secrets rotate-key`")
    conn = await _connect()
    try:
        report = await stored_secrets.reseal_all(conn, ring, rewrap=True)
    except secrets_at_rest.SealedValueError as exc:
        return _fail(f"{exc}; nothing was changed")
    finally:
        await conn.close()
    for line in report.lines(ring):
        print(line)
    return 0


async def providers_cmd(args: argparse.Namespace) -> int:
    conn = await _connect()
    try:
        if args.action == "apply":
            try:
                text = sys.stdin.read() if str(args.filename) == "-" else args.filename.read_text()
            except OSError as exc:
                return _fail(f"cannot read {args.filename}: {exc.strerror}")
            try:
                from hookline.handler_imports import handler_problem

                check = None if args.no_import_check else handler_problem
                for line in await providers.apply_providers(conn, text, check):
                    print(line)
            except SpecError as exc:
                return _fail(f"{args.filename}: {exc} (nothing was applied)")
        elif args.action == "list":
            rows = await conn.fetch(db.query("list_providers"))
            print(f"{'NAME':<24} {'SCHEME':<18} {'TARGET':<40} {'SECRETS':<8} MANAGED BY")
            for row in rows:
                spec: dict[str, Any] = row["spec"]
                target = spec.get("handler") or (spec.get("destination") or {}).get("url") or "-"
                print(f"{row['name']:<24} {spec.get('signature', {}).get('scheme', '?'):<18} "
                      f"{target:<40} {len(providers.active_secrets(row['secrets'])):<8} {providers.manager(row)}")
        elif args.action == "delete":
            try:
                deleted = await providers.delete(conn, args.name)
            except SpecError as exc:
                return _fail(str(exc))
            if not deleted:
                return _fail(f"no provider named {args.name!r}")
            print(f"provider/{args.name} deleted (its stored events are kept)")
    finally:
        await conn.close()
    return 0


async def receiver(args: argparse.Namespace) -> int:
    from hookline.core.host import Host
    from hookline.core.settings import Settings
    from hookline.receiver.app import Receiver

    secrets_at_rest.required_ring("the receiver")  # it verifies every request with a stored secret
    return await Host(Settings.for_command(args), [Receiver]).run()


async def worker(args: argparse.Namespace) -> int:
    from hookline.core.host import Host
    from hookline.core.settings import Settings
    from hookline.worker.service import Worker

    return await Host(Settings.for_command(args), [Worker]).run()


def _api_client(args: argparse.Namespace) -> Any:
    """The console client of ``--api`` (None without it)."""
    if not getattr(args, "api", None):
        return None
    from hookline.console.client import ApiClient
    from hookline.core.settings import CONSOLE_TOKEN

    token = args.token or os.environ.get(CONSOLE_TOKEN, "").strip()
    if not token:
        raise ConfigError(f"--api needs a token: --token T or {CONSOLE_TOKEN}")
    return ApiClient(args.api, token)


async def _through_api(lookup: Callable[[], list[str]]) -> int:
    from hookline.core.history import HistoryError

    try:
        lines = await asyncio.to_thread(lookup)
    except HistoryError as exc:
        print(f"hookline: {exc}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


async def dlq(args: argparse.Namespace) -> int:
    from hookline.relay.dlq import dlq_outbox
    from hookline.worker.dlq import dlq_inbox

    outbox_side = args.endpoint or args.since or args.until
    if (client := _api_client(args)) is not None:
        from hookline.console import client as api

        if outbox_side:
            return _fail("--api reaches inbox dead letters only: leave out --endpoint/--since/--until")
        if args.action == "list":
            return await _through_api(lambda: api.list_events(client, provider=args.provider, status=None,
                                                              since=None, limit=args.limit, dead_only=True))
        return await _through_api(lambda: api.replay(client, provider=args.provider, event_type=args.event_type,
                                                     event=args.event))
    if getattr(args, "event", None):
        if outbox_side or args.provider or args.event_type:
            return _fail("--event names one inbox event: give no other filter with it")
        return await _history(lambda conn: _replay_event(conn, args.event))
    if outbox_side and (args.provider or getattr(args, "event_type", None)):
        return _fail("--provider/--event-type select inbox events; --endpoint/--since/--until select outbox "
                     "deliveries: use one kind")
    conn = await _connect()
    try:
        if outbox_side:
            lines = await dlq_outbox(conn, args.action, endpoint=args.endpoint, since=args.since,
                                     until=args.until, limit=getattr(args, "limit", 50))
        else:
            lines = await dlq_inbox(conn, args.action, provider=args.provider,
                                    event_type=getattr(args, "event_type", None), limit=getattr(args, "limit", 50))
    finally:
        await conn.close()
    for line in lines:
        print(line)
    return 0


async def relay(args: argparse.Namespace) -> int:
    from hookline.core.host import Host
    from hookline.core.settings import Settings
    from hookline.relay.service import Relay

    settings = Settings.for_command(args)
    secrets_at_rest.required_ring("the relay")  # it signs every delivery with a stored secret
    return await Host(settings, [Relay]).run()


async def console(args: argparse.Namespace) -> int:
    from hookline.console.service import Console, announce_token
    from hookline.core.host import Host
    from hookline.core.settings import Settings

    settings = Settings.for_command(args)
    if settings.console.auth == "kubernetes":
        import importlib.util

        if importlib.util.find_spec("hookline.console.kube") is None:
            return _fail("--auth kubernetes needs hookline.console.kube, which this installation lacks: "
                         "use --auth token, or a release that ships it")
    return await Host(settings, [Console]).run(lambda host: announce_token(host.component(Console)))


# What the CLI may not do to a WebhookEndpoint's row (`enable` after a 410 it may: a recovery).
RESOURCE_OWNED_ACTIONS = frozenset({"update", "delete", "rotate-secret", "set-retention", "set-rate-limit", "pause",
                                    "resume", "egress"})


async def endpoints_cmd(args: argparse.Namespace) -> int:
    from hookline.core.history import table
    from hookline.core.status import endpoint_state
    from hookline.relay import endpoints

    conn = await _connect()
    try:
        if args.action in RESOURCE_OWNED_ACTIONS and await endpoints.managed_by(conn, args.name):
            namespace, _, name = args.name.partition("/")
            return _fail(f"endpoint {args.name} is the WebhookEndpoint {name!r} in namespace {namespace!r}: change "
                         f"the resource (kubectl edit whe {name} -n {namespace}); the operator would undo this")
        if args.action == "add":
            try:
                secret = await endpoints.add(
                    conn, args.name, args.url, event_types=args.event_types, ordered=args.ordered,
                    secret=args.secret, max_attempts=args.max_attempts, initial_delay=args.retry_initial_delay,
                    max_delay=args.retry_max_delay, timeout_seconds=args.timeout, done_hours=args.done_hours,
                    dead_days=args.dead_days)
            except endpoints.EndpointError as exc:
                return _fail(str(exc))
            print(f"endpoint/{args.name} added")
            if not args.secret:
                print(f"secret (shown once; verify deliveries with it): {secret}")
        elif args.action == "update":
            return await _update_endpoint(conn, args)
        elif args.action == "list":
            rows = [(e.name, endpoint_state(e.enabled, str(e.circuit.state), e.paused), "yes" if e.ordered else "no",
                     ",".join(e.event_types), endpoints.fingerprint(e.secrets[0]) if e.secrets else "-",
                     f"{_kept(e.done_hours, 'h')}/{_kept(e.dead_days, 'd')}", str(e.rate_limit or "-"),
                     e.url + (f"  [egress: {e.egress.describe()}]" if e.egress else ""))
                    for e in await endpoints.load(conn)]
            # Columns as wide as their widest cell: a WebhookEndpoint's name is NAMESPACE/NAME.
            for line in table(("NAME", "STATE", "ORDERED", "EVENT TYPES", "SECRET", "KEPT DONE/DEAD", "RATE LIMIT",
                               "URL"), rows, right=set()):
                print(line)
        elif args.action == "set-retention":
            try:
                found = await endpoints.set_retention(conn, args.name, args.done_hours, args.dead_days)
            except endpoints.EndpointError as exc:
                return _fail(str(exc))
            if not found:
                return _fail(f"no endpoint named {args.name!r}")
            print(f"endpoint/{args.name}: delivered events kept {_or_default(args.done_hours, 'h')}, "
                  f"dead letters {_or_default(args.dead_days, ' days')}")
        elif args.action == "delete":
            if not await endpoints.delete(conn, args.name):
                return _fail(f"no endpoint named {args.name!r}")
            print(f"endpoint/{args.name} deleted (with its deliveries)")
        elif args.action == "enable":
            unparked = await endpoints.enable(conn, args.name)
            if unparked is None:
                return _fail(f"no endpoint named {args.name!r}")
            print(f"endpoint/{args.name} enabled; {unparked} parked deliveries requeued")
        elif args.action == "set-rate-limit":
            return await _set_rate_limit(conn, args)
        elif args.action == "egress":
            return await _set_egress(conn, args)
        elif args.action in ("pause", "resume"):
            if not await endpoints.set_paused(conn, args.name, args.action == "pause"):
                return _fail(f"no endpoint named {args.name!r}")
            print(f"endpoint/{args.name} {'paused: its deliveries wait' if args.action == 'pause' else 'resumed'}")
        elif args.action == "rotate-secret":
            from datetime import timedelta

            rotated = await endpoints.rotate_secret(conn, args.name, timedelta(hours=args.overlap_hours))
            if rotated is None:
                return _fail(f"no endpoint named {args.name!r}")
            print(f"endpoint/{args.name}: new secret (shown once; the old one also signs for "
                  f"{args.overlap_hours:g} h): {rotated}")
    finally:
        await conn.close()
    return 0


async def _set_rate_limit(conn: asyncpg.Connection, args: argparse.Namespace) -> int:
    from hookline.relay import endpoints

    given = (args.per_second, args.burst, args.max_in_flight)
    if args.none == any(v is not None for v in given):
        return _fail("give --none, or --per-second with --burst and/or --max-in-flight")
    try:
        limit = None if args.none else endpoints.RateLimit(*given)
    except endpoints.EndpointError as exc:
        return _fail(str(exc))
    if not await endpoints.set_rate_limit(conn, args.name, limit):
        return _fail(f"no endpoint named {args.name!r}")
    print(f"endpoint/{args.name}: {'no rate limit' if limit is None else f'limited to {limit}'}")
    return 0


EGRESS_FLAGS = ("proxy", "proxy_credentials_file", "no_proxy", "direct", "client_cert", "client_key", "ca",
                "oauth2_token_url", "oauth2_client_id", "oauth2_client_secret_file", "oauth2_scope", "oauth2_audience")


def _egress_config(args: argparse.Namespace) -> EgressConfig | None:
    """The EgressConfig the flags describe (None: --clear); raises EgressError, or OSError for a file."""
    from hookline.relay import endpoints as e

    def read(path: str | None, *, line: bool = False) -> str | None:
        if path is None:
            return None
        text = Path(path).read_text()
        return text.strip() if line else text

    if args.clear:
        return None
    if (args.proxy_credentials_file or args.no_proxy) and not args.proxy:
        raise e.EgressError("--proxy-credentials-file and --no-proxy go with --proxy")
    bypass = tuple(h.strip() for h in (args.no_proxy or "").split(",") if h.strip())
    proxy = e.ProxyConfig(args.proxy, read(args.proxy_credentials_file, line=True), bypass) if args.proxy else None
    tls = e.ClientTls(read(args.client_cert), read(args.client_key), read(args.ca)) \
        if args.client_cert or args.client_key or args.ca else None
    oauth_flags = (args.oauth2_token_url, args.oauth2_client_id, args.oauth2_client_secret_file)
    oauth2 = None
    if any(oauth_flags) or args.oauth2_scope or args.oauth2_audience:
        if not all(oauth_flags):
            raise e.EgressError("OAuth2 needs --oauth2-token-url, --oauth2-client-id and --oauth2-client-secret-file")
        oauth2 = e.OAuth2ClientCredentials(args.oauth2_token_url, args.oauth2_client_id,
                                           read(args.oauth2_client_secret_file, line=True) or "",
                                           tuple(args.oauth2_scope), args.oauth2_audience)
    return e.EgressConfig(proxy, args.direct, tls, oauth2)


async def _set_egress(conn: asyncpg.Connection, args: argparse.Namespace) -> int:
    from hookline.relay import endpoints

    if args.clear and any(getattr(args, flag) for flag in EGRESS_FLAGS):
        return _fail("--clear removes the endpoint's egress: give it alone")
    try:
        config = _egress_config(args)
        found = await endpoints.set_egress(conn, args.name, config)
    except endpoints.EgressError as exc:
        return _fail(f"{exc} (nothing was changed)")
    except OSError as exc:
        return _fail(f"cannot read {exc.filename}: {exc.strerror}")
    if not found:
        return _fail(f"no endpoint named {args.name!r}")
    print(f"endpoint/{args.name}: " + ("the install's egress" if config is None else f"egress {config.describe()}"))
    return 0


def _or_default(value: float | None, unit: str) -> str:
    return "the install's default" if value is None else f"{value:g}{unit}"


def _kept(value: float | None, unit: str) -> str:
    return "default" if value is None else f"{value:g}{unit}"


async def status(args: argparse.Namespace) -> int:
    import json

    from hookline.core.status import collect, render_table

    conn = await _connect()
    try:
        found = await collect(conn, max_oldest_due_seconds=args.max_oldest_due)
    finally:
        await conn.close()
    print(json.dumps(found.as_json(), indent=2) if args.output == "json" else render_table(found))
    return 1 if found.problems() else 0


async def _replay_event(conn: asyncpg.Connection, ref: str) -> list[str]:
    from hookline.core.history import EventRef, replay_event

    return [await replay_event(conn, EventRef.parse(ref))]


async def events(args: argparse.Namespace) -> int:
    from hookline.core.history import EventRef, event_lines, event_record, list_events

    if (client := _api_client(args)) is not None:
        from hookline.console import client as api

        if args.action == "list":
            return await _through_api(lambda: api.list_events(
                client, provider=args.provider, status=args.status,
                since=args.since.isoformat() if args.since else None, limit=args.limit))
        return await _through_api(lambda: api.show_event(client, args.provider, args.event_id, args.output))
    if args.action == "list":
        return await _history(lambda conn: list_events(conn, provider=args.provider, status=args.status,
                                                       since=args.since, limit=args.limit))
    ref = EventRef(args.provider, args.event_id)
    return await _history(lambda conn: _shown(event_record(conn, ref), event_lines, args.output))


async def deliveries(args: argparse.Namespace) -> int:
    from hookline.core.history import delivery_lines, delivery_records, list_deliveries

    if args.action == "list":
        return await _history(lambda conn: list_deliveries(conn, endpoint=args.endpoint, status=args.status,
                                                           limit=args.limit))
    return await _history(lambda conn: _shown(delivery_records(conn, args.id), delivery_lines, args.output,
                                              json_key="deliveries"))


HistoryRecord = TypeVar("HistoryRecord")


async def _shown(record: Awaitable[HistoryRecord], lines: Callable[[HistoryRecord], list[str]], output: str,
                 json_key: str | None = None) -> list[str]:
    """A history record as lines for people, or as one JSON document (``-o json``; a list goes
    under ``json_key``, so that the document is an object scripts can extend)."""
    import json

    found = await record
    if output == "json":
        return [json.dumps(found if json_key is None else {json_key: found}, indent=2)]
    return lines(found)


async def _history(lookup: Callable[[asyncpg.Connection], Awaitable[list[str]]]) -> int:
    """Run one history lookup and print its lines; a reference that names nothing is exit status 1."""
    from hookline.core.history import HistoryError

    conn = await _connect()
    try:
        lines = await lookup(conn)
    except HistoryError as exc:
        print(f"hookline: {exc}", file=sys.stderr)
        return 1
    finally:
        await conn.close()
    for line in lines:
        print(line)
    return 0


async def dev(args: argparse.Namespace) -> int:
    from hookline.dev import run_dev

    return await run_dev(args)


async def _update_endpoint(conn: asyncpg.Connection, args: argparse.Namespace) -> int:
    from hookline.relay import endpoints

    try:
        found = await endpoints.update(conn, args.name, url=args.url, event_types=args.event_types,
                                       ordered=args.ordered, max_attempts=args.max_attempts,
                                       initial_delay=args.retry_initial_delay, max_delay=args.retry_max_delay,
                                       timeout_seconds=args.timeout)
    except endpoints.EndpointError as exc:
        return _fail(str(exc))
    if not found:
        return _fail(f"no endpoint named {args.name!r}")
    print(f"endpoint/{args.name} updated (its deliveries and secret are kept)")
    return 0


def _read_input(path: Path) -> bytes:
    """A file's bytes, or stdin's for '-'; a ConfigError saying why not."""
    from hookline.core.config import ConfigError

    try:
        return sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


async def send_test(args: argparse.Namespace) -> int:
    import asyncio

    from hookline import devstack
    from hookline.core.sample_event import sample_request

    body = _read_input(args.body) if args.body else None
    secrets_at_rest.required_ring("`hookline send-test` (it signs with the provider's stored secret)")
    conn = await _connect()
    try:
        if not await conn.fetchval(db.query("provider_exists", "commands.sql"), args.provider):
            return _fail(f"no provider named {args.provider!r} (`hookline providers list` shows them)")
        provider = (await providers.load_all(conn)).get(args.provider)
    finally:
        await conn.close()
    if provider is None:  # load_all logged why: its spec no longer parses, or its secret does not open
        return _fail(f"provider {args.provider!r} cannot be loaded: its stored spec no longer parses, or its secret "
                     f"does not open with the keys in {secrets_at_rest.KEYS_FILE_ENV}")
    try:
        request = sample_request(provider, body)
    except ValueError as exc:
        return _fail(f"cannot sign for {args.provider!r}: {exc}")
    stack = devstack.find() if args.url is None else None
    base = args.url or (stack.receiver_url if stack else devstack.DEFAULT_RECEIVER_URL)
    print(request.curl(base))
    try:
        status, answer = await asyncio.to_thread(_post, request.url(base), request.headers, request.body)
    except OSError as exc:
        return _fail(f"cannot reach the receiver at {base}: {getattr(exc, 'reason', exc)} (is `hookline dev` "
                     "running? --url names another receiver)")
    print(f"answer: HTTP {status} {answer}")
    return 0 if 200 <= status < 300 else 1


def _post(url: str, headers: dict[str, str], body: bytes) -> tuple[int, str]:
    """POST and return (status, body text); an HTTP error status is an answer too."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(4096).decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(4096).decode("utf-8", errors="replace")


async def publish(args: argparse.Namespace) -> int:
    import json

    from hookline import outbox

    text = _read_input(Path(args.data[1:])).decode("utf-8", errors="replace") if args.data.startswith("@") \
        else args.data
    try:
        payload = json.loads(text)
    except ValueError as exc:
        return _fail(f"--data is not JSON: {exc}")
    conn = await _connect()
    try:
        async with conn.transaction():
            event_id = await outbox.publish(conn, args.event_type, payload, aggregate_type=args.aggregate_type,
                                            aggregate_id=args.aggregate_id, endpoint=args.endpoint,
                                            namespace=args.namespace)
            endpoints = await conn.fetchval(db.query("endpoints_of_event", "commands.sql"), event_id)
    except (asyncpg.InvalidParameterValueError, asyncpg.InsufficientPrivilegeError) as exc:
        # hookline.publish's own checks: no such endpoint, another tenant's namespace, ...
        return _fail(str(exc).removeprefix("hookline.publish: "))
    finally:
        await conn.close()
    print(f"published {event_id} ({args.event_type}) to {len(endpoints)} endpoint"
          f"{'' if len(endpoints) == 1 else 's'}{': ' + ', '.join(endpoints) if endpoints else ''}")
    if not endpoints:
        print("hookline: warning: no endpoint's event types match; nothing will be delivered", file=sys.stderr)
    return 0
