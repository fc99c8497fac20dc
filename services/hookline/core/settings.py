"""Every setting of a Hookline service, read once: the command's arguments plus the environment.

``Settings.for_command`` is the one place where the services read ``HOOKLINE_*`` variables (the
names are part of the contract; each is documented in the ``--help`` of the commands that read it).
A bad value raises ``ConfigError`` naming the flag or variable, which the CLI prints as one line
(exit status 2). The settings are frozen: a component reads its own part (``settings.receiver``,
``.worker``, ``.relay``) and the ``Host`` (core/host.py) the rest.

``HOOKLINE_DATABASE_PASSWORD_FILE`` (``database_password_file``) names a file read at every new
connection (core/db.py): the services' settings carry its path beside the URL; the one-shot commands
and the operator, which connect to HOOKLINE_DATABASE_URL, read both when they connect.

Some are read at each use rather than once, each by its own function here: ``HOOKLINE_SECRET_KEYS_FILE``
(``keys_file``, by core/secrets_at_rest.py: `hookline dev` names its own file after start-up),
``HOOKLINE_HANDLER_SEARCH_PATH`` (``handler_search_path``, when worker/processing.py is imported),
the CLI's ``HOOKLINE_IMPORT_PATH`` and ``HOOKLINE_DEV_DATA_DIR``, and the operator's worker settings
(``worker_image``, ``worker_template_file``, ``worker_connection_budget``, ``handler_modules``: the
chart may change the files behind them while the operator runs). This module imports nothing heavy:
the parser (cli.py) reads its defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from hookline.core.config import ConfigError

if TYPE_CHECKING:  # imported where used: the parser (cli.py) reads this module's defaults, and fast
    from hookline.core.http_client import EgressProxy
    from hookline.core.partitions import Retention
    from hookline.relay.breaker import BreakerSettings

Environ = Mapping[str, str]

DATABASE_URL = "HOOKLINE_DATABASE_URL"
DATABASE_PASSWORD_FILE = "HOOKLINE_DATABASE_PASSWORD_FILE"
# What needs a session (LISTEN, leader election leases, migrations, one-shot commands) when
# HOOKLINE_DATABASE_URL goes through a transaction-mode pooler, and how Hookline is told it does.
DATABASE_SESSION_URL = "HOOKLINE_DATABASE_SESSION_URL"
DATABASE_POOLING = "HOOKLINE_DATABASE_POOLING"
POOLING_MODES = ("session", "transaction")
LOG_FORMAT, LOG_LEVEL = "HOOKLINE_LOG_FORMAT", "HOOKLINE_LOG_LEVEL"
REUSE_PORT = "HOOKLINE_REUSE_PORT"  # set by `hookline receiver --processes N` for its children
DESTINATION_SECRET_FILE = "HOOKLINE_DESTINATION_SECRET_FILE"
HANDLER_SEARCH_PATH = "HOOKLINE_HANDLER_SEARCH_PATH"
ALLOW_PRIVATE_NETWORKS = "HOOKLINE_ALLOW_PRIVATE_NETWORKS"
EGRESS_PROXY = "HOOKLINE_EGRESS_PROXY"
EGRESS_PROXY_CREDENTIALS_FILE = "HOOKLINE_EGRESS_PROXY_CREDENTIALS_FILE"
EGRESS_NO_PROXY = "HOOKLINE_EGRESS_NO_PROXY"
KEYS_FILE = "HOOKLINE_SECRET_KEYS_FILE"
IMPORT_PATH = "HOOKLINE_IMPORT_PATH"
DEV_DATA_DIR = "HOOKLINE_DEV_DATA_DIR"
# The operator's, from the chart: its workers' image, pod template, connection budget, handler modules.
WORKER_IMAGE = "HOOKLINE_WORKER_IMAGE"
WORKER_TEMPLATE = "HOOKLINE_WORKER_TEMPLATE"
WORKER_CONNECTION_BUDGET = "HOOKLINE_WORKER_CONNECTION_BUDGET"
HANDLER_MODULES = "HOOKLINE_HANDLER_MODULES"
# The receiver's limits (ReceiverSettings fields) and the variable each flag's default comes from.
RECEIVER_LIMITS = {
    "header_timeout": "HOOKLINE_HEADER_TIMEOUT",
    "body_timeout": "HOOKLINE_BODY_TIMEOUT",
    "keepalive_timeout": "HOOKLINE_KEEPALIVE_TIMEOUT",
    "max_buffered_bodies": "HOOKLINE_MAX_BUFFERED_BODIES",
    "max_buffered_bytes": "HOOKLINE_MAX_BUFFERED_BYTES",
    "max_queued_events": "HOOKLINE_MAX_QUEUED_EVENTS",
}
# Postgres's own default search path, where handlers' statements run unless told otherwise.
DEFAULT_HANDLER_SEARCH_PATH = '"$user", public'
_SCHEMA_LIST = re.compile(r'\s*("[^";]+"|[A-Za-z_][A-Za-z0-9_$]*)(\s*,\s*("[^";]+"|[A-Za-z_][A-Za-z0-9_$]*))*\s*')


# --- reading one variable -------------------------------------------------------------------------


def database_url(environ: Environ = os.environ) -> str:
    url = environ.get(DATABASE_URL, "").strip()
    if not url:
        raise ConfigError(
            f"{DATABASE_URL} is not set: point it at Postgres, e.g. "
            "postgresql://user:password@localhost:5432/hookline (or run `hookline dev`)"
        )
    return _postgres_url(DATABASE_URL, url)


def _postgres_url(name: str, url: str) -> str:
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"{name} must be a postgresql:// URL")
    return url


def database_session_url(environ: Environ = os.environ) -> str | None:
    """HOOKLINE_DATABASE_SESSION_URL: where the connections that need a session of their own open
    (LISTEN, leader election, migrations, the one-shot commands), direct to Postgres or through a
    session-mode pooler; None when unset (they open from HOOKLINE_DATABASE_URL)."""
    url = environ.get(DATABASE_SESSION_URL, "").strip()
    return _postgres_url(DATABASE_SESSION_URL, url) if url else None


def has_password(url: str) -> bool:
    parts = urlsplit(url)
    return parts.password is not None or "password" in parse_qs(parts.query)


def session_password_file(environ: Environ = os.environ) -> Path | None:
    """The password file of the session URL's connections: HOOKLINE_DATABASE_PASSWORD_FILE, unless the
    session URL carries a password of its own (a pooler and Postgres may know a user by different ones)."""
    url = database_session_url(environ)
    return None if url is not None and has_password(url) else database_password_file(environ)


def transaction_pooling(environ: Environ = os.environ) -> bool:
    """HOOKLINE_DATABASE_POOLING=transaction: HOOKLINE_DATABASE_URL goes through a pooler in transaction
    mode (PgBouncer's pool_mode=transaction, RDS Proxy, Supavisor's port 6543), where no session state
    lasts beyond a transaction. It cannot be detected reliably from a client, so it is said. Such a
    pooler cannot hold a LISTEN or a leader's lease: HOOKLINE_DATABASE_SESSION_URL is then required."""
    mode = environ.get(DATABASE_POOLING, "").strip().lower() or "session"
    if mode not in POOLING_MODES:
        raise ConfigError(f"{DATABASE_POOLING} must be one of {', '.join(POOLING_MODES)}, not {mode!r}")
    if mode == "transaction" and database_session_url(environ) is None:
        raise ConfigError(f"{DATABASE_POOLING}=transaction: set {DATABASE_SESSION_URL} to a direct (or session-mode) "
                          "Postgres URL for LISTEN, leader election and migrations")
    return mode == "transaction"


def database_password_file(environ: Environ = os.environ) -> Path | None:
    """HOOKLINE_DATABASE_PASSWORD_FILE: a file holding the password of HOOKLINE_DATABASE_URL's user,
    read anew for every connection Hookline opens (core/db.py), so that a short-lived token (RDS IAM,
    Cloud SQL IAM, Entra ID) can be refreshed in place; None when unset.

    Checked here, at start-up: the file must be readable and hold a password, and the URL must carry
    none (two sources of one password: the stale one would win or lose silently). The content is never
    part of an error, only the path."""
    configured = environ.get(DATABASE_PASSWORD_FILE, "").strip()
    if not configured:
        return None
    path = Path(configured)
    if has_password(environ.get(DATABASE_URL, "").strip()):
        raise ConfigError(f"{DATABASE_URL} has a password and {DATABASE_PASSWORD_FILE} is set: give the password "
                          "one way (remove it from the URL to use the file)")
    try:
        read_password_file(path)
    except PasswordFileError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"{DATABASE_PASSWORD_FILE}: cannot read {path}: {exc.strerror or exc}") from None
    return path


class PasswordFileError(OSError):
    """The password file holds no password (empty: a writer caught mid-rewrite, or not text). An
    OSError, as a file that cannot be read is: a connection that meets it is retried later, as one to
    an unreachable server is (core/db.py DATABASE_ERRORS). Its message names the file, never its content."""


def read_password_file(path: Path) -> str:
    """The password in ``path``: its text less one trailing newline (what `echo` and most token
    writers add); anything else, other whitespace included, is part of the password."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PasswordFileError(f"{DATABASE_PASSWORD_FILE}: {path} is not UTF-8 text") from None
    password = text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text
    if not password:
        raise PasswordFileError(f"{DATABASE_PASSWORD_FILE}: {path} is empty")
    return password


def env_flag(name: str, default: bool = False, environ: Environ = os.environ) -> bool:
    value = environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def _positive(name: str, default: float, environ: Environ) -> float:
    """A number of hours or days from its variable: greater than 0."""
    return float(_limit(name, float(default), environ))


def keys_file(environ: Environ = os.environ) -> Path | None:
    """HOOKLINE_SECRET_KEYS_FILE, read at each use (core/secrets_at_rest.py): a key file rotated in
    place, or named anew by `hookline dev`, is picked up without a restart."""
    configured = environ.get(KEYS_FILE, "").strip()
    return Path(configured) if configured else None


def _limit(name: str, default: int | float, environ: Environ) -> int | float:
    """A number greater than 0 from its variable, of ``default``'s type; unset: ``default``
    (for a receiver limit, a flag given on the command line wins)."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    kind = type(default)
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{name} must be {'an integer' if kind is int else 'a number'}, not {raw!r}") from None
    if not value > 0:
        raise ConfigError(f"{name} must be greater than 0, not {raw!r}")
    return value


def retention_from_env(environ: Environ = os.environ) -> Retention:
    """HOOKLINE_RETENTION_DONE_HOURS, _DEAD_DAYS, _DEDUP_DAYS, _MAX_DONE_HOURS, _MAX_DEAD_DAYS and
    HOOKLINE_ENDPOINT_RETENTION_DONE_HOURS, _DEAD_DAYS (the chart's retention values)."""
    from hookline.core.partitions import Retention

    default = Retention()
    done_hours = _positive("HOOKLINE_RETENTION_DONE_HOURS", default.done_hours, environ)
    dead_days = _positive("HOOKLINE_RETENTION_DEAD_DAYS", default.dead_days, environ)
    # Unset maxima never fall below the defaults an install chose.
    return Retention(
        done_hours=done_hours, dead_days=dead_days,
        max_done_hours=_positive("HOOKLINE_RETENTION_MAX_DONE_HOURS", max(default.max_done_hours, done_hours),
                                 environ),
        max_dead_days=_positive("HOOKLINE_RETENTION_MAX_DEAD_DAYS", max(default.max_dead_days, dead_days), environ),
        dedup_days=_positive("HOOKLINE_RETENTION_DEDUP_DAYS", default.dedup_days, environ),
        endpoint_done_hours=_positive("HOOKLINE_ENDPOINT_RETENTION_DONE_HOURS", default.endpoint_done_hours, environ),
        endpoint_dead_days=_positive("HOOKLINE_ENDPOINT_RETENTION_DEAD_DAYS", default.endpoint_dead_days, environ))


def handler_search_path(environ: Environ = os.environ) -> str:
    """HOOKLINE_HANDLER_SEARCH_PATH: where a worker's handlers' statements run (Postgres's default
    unless set); the worker's own statements keep the pinned one."""
    value = environ.get(HANDLER_SEARCH_PATH) or DEFAULT_HANDLER_SEARCH_PATH
    if not _SCHEMA_LIST.fullmatch(value):
        raise ConfigError(f"{HANDLER_SEARCH_PATH} must be a list of schema names, not {value!r}")
    return value


def import_path(environ: Environ = os.environ) -> list[Path]:
    """HOOKLINE_IMPORT_PATH: more directories to import handler modules from (os.pathsep apart)."""
    dirs = [Path(p) for p in environ.get(IMPORT_PATH, "").split(os.pathsep) if p.strip()]
    for directory in dirs:
        if not directory.is_dir():
            raise ConfigError(f"{IMPORT_PATH}: {directory} is not a directory")
    return dirs


def dev_data_dir(default: Path, environ: Environ = os.environ) -> Path:
    """HOOKLINE_DEV_DATA_DIR: where the CLI looks for the running `hookline dev`'s record."""
    return Path(environ.get(DEV_DATA_DIR, "").strip() or default)


def database_url_given(environ: Environ = os.environ) -> bool:
    """Whether HOOKLINE_DATABASE_URL is set (else the CLI may use the running `hookline dev`)."""
    return bool(environ.get(DATABASE_URL, "").strip())


def worker_image(default: str, environ: Environ = os.environ) -> str:
    """HOOKLINE_WORKER_IMAGE: the image of the operator's worker Deployments (without a template)."""
    return environ.get(WORKER_IMAGE, "").strip() or default


def worker_template_file(environ: Environ = os.environ) -> Path | None:
    """HOOKLINE_WORKER_TEMPLATE: the file with the workers' pod template (the chart mounts it)."""
    configured = environ.get(WORKER_TEMPLATE, "").strip()
    return Path(configured) if configured else None


def worker_connection_budget(environ: Environ = os.environ) -> int | None:
    """HOOKLINE_WORKER_CONNECTION_BUDGET: connections all workers may hold together; None: no limit."""
    raw = environ.get(WORKER_CONNECTION_BUDGET, "").strip()
    if not raw:
        return None
    try:
        budget = int(raw)
    except ValueError:
        raise ConfigError(f"{WORKER_CONNECTION_BUDGET} must be a whole number of connections, not {raw!r}") from None
    if budget < 0:
        raise ConfigError(f"{WORKER_CONNECTION_BUDGET} must not be negative, not {budget}")
    return budget


def handler_modules(environ: Environ = os.environ) -> dict[str, list[str]] | None:
    """HOOKLINE_HANDLER_MODULES (the chart's operator.handlerModules): which module prefixes each
    namespace's handlers may name, as JSON; None (no limit) when unset."""
    import json

    raw = environ.get(HANDLER_MODULES)
    if raw is None:
        return None
    try:
        policy = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{HANDLER_MODULES} is not JSON: {exc}") from None
    if not isinstance(policy, dict) or not all(
            isinstance(v, list) and all(isinstance(p, str) for p in v) for v in policy.values()):
        raise ConfigError(f"{HANDLER_MODULES} must map namespaces to lists of module prefixes")
    return policy


# --- the settings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogSettings:
    level: str = "INFO"
    format: str = "json"  # or "text"

    @classmethod
    def read(cls, level: str | None, *, for_people: bool, terminal: bool, environ: Environ = os.environ
             ) -> LogSettings:
        """``level``: --log-level (else HOOKLINE_LOG_LEVEL, else INFO). The format is
        HOOKLINE_LOG_FORMAT when set; else text for people (``for_people``, or stderr a ``terminal``)."""
        fmt = environ.get(LOG_FORMAT, "").strip().lower()
        if fmt and fmt not in ("json", "text"):
            raise ConfigError(f"{LOG_FORMAT} must be json or text, not {fmt!r}")
        chosen = (level or environ.get(LOG_LEVEL) or "INFO").strip().upper()
        if chosen not in logging.getLevelNamesMapping():
            source = "--log-level" if level else LOG_LEVEL
            raise ConfigError(f"{source} must be DEBUG, INFO, WARNING or ERROR, not {chosen.lower()!r}")
        return cls(chosen, fmt or ("text" if for_people or terminal else "json"))


@dataclass(frozen=True)
class OpsAddress:
    """Where a worker or relay serves /healthz, /readyz and /metrics (the receiver: on its own port)."""

    host: str
    port: int


@dataclass(frozen=True)
class ReceiverSettings:
    host: str = "0.0.0.0"
    port: int = 8080
    max_batch: int = 32
    batch_window: float = 0.001  # seconds
    db_connections: int = 4
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keepalive_timeout: float = 75.0
    max_buffered_bodies: int = 1024
    max_buffered_bytes: int = 256 * 1024 * 1024
    max_queued_events: int = 4096
    reuse_port: bool = False  # HOOKLINE_REUSE_PORT=1: several processes share the port


@dataclass(frozen=True)
class WorkerSettings:
    providers: tuple[str, ...] | None = None  # None: every provider
    concurrency: int = 16
    sweep: bool = False  # also the inbox's lease rescuer and the partition manager, on their leaders
    batch_seconds: float = 0.05
    poll_interval: float = 1.0
    grace_period: float = 25.0
    destination_secret_file: Path | None = None


@dataclass(frozen=True)
class RelaySettings:
    concurrency: int = 64
    allow_private_networks: bool = False
    poll_interval: float = 1.0
    lease_seconds: float = 60.0
    grace_period: float = 25.0
    breaker: BreakerSettings = field(default_factory=lambda: _breaker())
    sweep_interval: float = 5.0  # seconds between the outbox's lease rescues
    stats_interval: float = 5.0
    egress_proxy: EgressProxy | None = None  # HOOKLINE_EGRESS_PROXY (its credentials are not in its repr)


CONSOLE_TOKEN = "HOOKLINE_CONSOLE_TOKEN"
CONSOLE_CSRF_KEY_FILE = "HOOKLINE_CONSOLE_CSRF_KEY_FILE"
CONSOLE_AUTH_MODES = ("token", "kubernetes")
MIN_CSRF_KEY_CHARS = 32
# What `openssl rand -hex|-base64` and Helm's randAlphaNum write: a file holding anything else (a
# space, a second line, binary) is more likely the wrong file than a key.
CSRF_KEY_PATTERN = re.compile(r"[!-~]+")


@dataclass(frozen=True)
class ConsoleSettings:
    """``hookline console``: where it listens, who decides access (``token``: one shared token,
    HOOKLINE_CONSOLE_TOKEN or generated at start; ``kubernetes``: TokenReview and
    SubjectAccessReview, for tokens issued for one of ``audiences``), the statement timeout of every
    read (seconds), and the key of the pages' CSRF tokens (HOOKLINE_CONSOLE_CSRF_KEY_FILE)."""

    host: str = "127.0.0.1"
    port: int = 8090
    auth: str = "token"
    token: str | None = field(default=None, repr=False)  # never in a log line
    statement_timeout: float = 5.0
    # The pages' CSRF key, shared by every replica (None: a random one per process); never logged.
    csrf_key: bytes | None = field(default=None, repr=False)
    audiences: tuple[str, ...] = ()  # --auth kubernetes: what a token must be issued for (empty: the API server's)


@dataclass(frozen=True)
class Settings:
    """One process's settings. ``database_url`` is where the pool connects, with the password in
    ``database_password_file`` when that is set; ``database_session_url`` (None: ``database_url``) where
    every dedicated connection does (``session_url``, ``session_password_file``); ``transaction_pooling``:
    ``database_url`` goes through a transaction-mode pooler (see ``transaction_pooling()``);
    ``ops``: the worker's or relay's ops address (None: none)."""

    database_url: str
    receiver: ReceiverSettings = field(default_factory=ReceiverSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    relay: RelaySettings = field(default_factory=RelaySettings)
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    retention: Retention = field(default_factory=lambda: _retention())
    ops: OpsAddress | None = None
    database_password_file: Path | None = None
    database_session_url: str | None = None
    transaction_pooling: bool = False

    @property
    def session_url(self) -> str:
        return self.database_session_url or self.database_url

    @property
    def session_password_file(self) -> Path | None:
        url = self.database_session_url
        return None if url is not None and has_password(url) else self.database_password_file

    @classmethod
    def for_command(cls, args: argparse.Namespace, environ: Environ = os.environ) -> Settings:
        """The settings of ``hookline receiver|worker|relay|dev`` from its parsed ``args`` and the environment."""
        # `hookline dev` reads no HOOKLINE_DATABASE_URL (nor its password file): its database is the
        # embedded one, known once it runs.
        if args.command == "dev":
            # The whole stack on one pool, as `hookline dev` always ran it: its receiver with the
            # default limits, a small worker that also sweeps, a relay for endpoints on this machine.
            return cls("", receiver=ReceiverSettings(host=args.host, port=args.port),
                       worker=WorkerSettings(concurrency=8, sweep=True),
                       relay=RelaySettings(concurrency=16, allow_private_networks=True),
                       console=ConsoleSettings(host=args.host, port=getattr(args, "console_port", 8090),
                                               token=environ.get(CONSOLE_TOKEN, "").strip() or None),
                       retention=retention_from_env(environ))
        database = cls(database_url(environ), database_password_file=database_password_file(environ),
                       database_session_url=database_session_url(environ),
                       transaction_pooling=transaction_pooling(environ))
        if args.command == "receiver":
            return dataclasses.replace(database, receiver=_receiver(args, environ))
        # The retention variables are read where a partition manager may run: a relay, `worker --sweep`, dev.
        if args.command == "worker":
            return dataclasses.replace(database, worker=_worker(args, environ),
                                       retention=retention_from_env(environ) if args.sweep else _retention(),
                                       ops=OpsAddress(args.host, args.port))
        if args.command == "relay":
            relay, retention = _relay(args, environ, retention_from_env(environ))
            return dataclasses.replace(database, relay=relay, retention=retention,
                                       ops=OpsAddress(args.host, args.port))
        if args.command == "console":
            return dataclasses.replace(database, console=console_settings(args, environ))
        raise ValueError(f"no service settings for `hookline {args.command}`")


def _breaker() -> BreakerSettings:
    from hookline.relay.breaker import BreakerSettings

    return BreakerSettings()


def _retention() -> Retention:
    from hookline.core.partitions import Retention

    return Retention()


def _receiver(args: argparse.Namespace, environ: Environ) -> ReceiverSettings:
    defaults = ReceiverSettings()
    # Each limit: its flag when given (argparse checked it), else its variable, else the default.
    limits: dict[str, Any] = {
        name: getattr(args, name) if getattr(args, name) is not None else _limit(variable, getattr(defaults, name),
                                                                                  environ)
        for name, variable in RECEIVER_LIMITS.items()}
    return dataclasses.replace(defaults, host=args.host, port=args.port, max_batch=args.max_batch,
                               batch_window=args.batch_window_ms / 1000, db_connections=args.db_connections,
                               reuse_port=environ.get(REUSE_PORT) == "1", **limits)


def _worker(args: argparse.Namespace, environ: Environ) -> WorkerSettings:
    if args.concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    providers = tuple(args.providers) if args.providers else None
    return WorkerSettings(providers=providers, concurrency=args.concurrency, sweep=args.sweep,
                          batch_seconds=args.batch_seconds, poll_interval=args.poll_interval,
                          grace_period=args.grace_period,
                          destination_secret_file=_destination_secret_file(providers, environ))


def _destination_secret_file(providers: tuple[str, ...] | None, environ: Environ) -> Path | None:
    """HOOKLINE_DESTINATION_SECRET_FILE: the destination signing secret of the worker's one provider, as
    the operator mounts it into a tenant's workers (they have no key to open the stored one)."""
    configured = environ.get(DESTINATION_SECRET_FILE, "").strip()
    if not configured:
        return None
    if len(providers or ()) != 1:
        raise ConfigError(f"{DESTINATION_SECRET_FILE} is one provider's destination secret: "
                          "run the worker with exactly one --provider")
    return Path(configured)


def _relay(args: argparse.Namespace, environ: Environ, retention: Retention) -> tuple[RelaySettings, Retention]:
    from hookline.relay.breaker import BreakerSettings

    if args.concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    breaker = BreakerSettings(failure_rate=args.breaker_failure_rate, min_volume=args.breaker_min_volume,
                              window_seconds=args.breaker_window, probe_interval=args.breaker_probe_interval,
                              close_after=args.breaker_close_after)
    if problems := breaker.problems():
        raise ConfigError("; ".join(problems))
    if args.retention_hours is not None:
        if not args.retention_hours > 0:
            raise ConfigError("--retention-hours must be greater than 0")
        # The endpoints' default retention, for the partition manager this relay may lead.
        retention = dataclasses.replace(retention, endpoint_done_hours=args.retention_hours)
    allow_private = args.allow_private_networks or env_flag(ALLOW_PRIVATE_NETWORKS, environ=environ)
    return RelaySettings(concurrency=args.concurrency, allow_private_networks=allow_private,
                         poll_interval=args.poll_interval, lease_seconds=args.lease_seconds,
                         grace_period=args.grace_period, breaker=breaker,
                         egress_proxy=egress_proxy(environ)), retention


def egress_proxy(environ: Environ) -> EgressProxy | None:
    """HOOKLINE_EGRESS_PROXY (http://host:port), with user:password from
    HOOKLINE_EGRESS_PROXY_CREDENTIALS_FILE (read once, here) and the hosts that go direct in
    HOOKLINE_EGRESS_NO_PROXY. No error names the credentials."""
    from hookline.core.http_client import EgressProxy

    url = environ.get(EGRESS_PROXY, "").strip()
    credentials_file = environ.get(EGRESS_PROXY_CREDENTIALS_FILE, "").strip()
    no_proxy = environ.get(EGRESS_NO_PROXY, "")
    if not url:
        if credentials_file or no_proxy.strip():
            raise ConfigError(f"{EGRESS_PROXY_CREDENTIALS_FILE} and {EGRESS_NO_PROXY} need {EGRESS_PROXY}")
        return None
    credentials = None
    if credentials_file:
        try:
            credentials = Path(credentials_file).read_text(encoding="utf-8").strip()
        except UnicodeDecodeError:
            raise ConfigError(f"{EGRESS_PROXY_CREDENTIALS_FILE}: {credentials_file} is not UTF-8 text") from None
        except OSError as exc:
            raise ConfigError(f"{EGRESS_PROXY_CREDENTIALS_FILE}: cannot read {credentials_file}: "
                              f"{exc.strerror or exc}") from None
    try:
        return EgressProxy.parse(url, credentials=credentials, no_proxy=no_proxy)
    except ValueError as exc:
        if str(exc).startswith("the egress proxy credentials"):
            raise ConfigError(f"{EGRESS_PROXY_CREDENTIALS_FILE}: {exc}") from None
        name = EGRESS_NO_PROXY if "no-proxy" in str(exc) else EGRESS_PROXY
        raise ConfigError(f"{name}: {exc}") from None


def console_settings(args: argparse.Namespace, environ: Environ) -> ConsoleSettings:
    if args.auth not in CONSOLE_AUTH_MODES:
        raise ConfigError(f"--auth must be one of {', '.join(CONSOLE_AUTH_MODES)}, not {args.auth!r}")
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be from 1 to 65535, not {args.port}")
    if not args.statement_timeout > 0:
        raise ConfigError("--statement-timeout must be greater than 0")
    token = environ.get(CONSOLE_TOKEN, "").strip() or None
    if token is not None and len(token) < 16:
        raise ConfigError(f"{CONSOLE_TOKEN} is too short to guard anything: give at least 16 characters")
    audiences = tuple(args.audiences or ())
    if audiences and args.auth != "kubernetes":
        raise ConfigError("--audience is what a Kubernetes token must be issued for: it needs --auth kubernetes")
    if any(not audience.strip() or audience != audience.strip() for audience in audiences):
        raise ConfigError("--audience must not be empty nor start or end with whitespace")
    return ConsoleSettings(host=args.host, port=args.port, auth=args.auth, token=token,
                           statement_timeout=args.statement_timeout, csrf_key=console_csrf_key(environ),
                           audiences=audiences)


def console_csrf_key(environ: Environ = os.environ) -> bytes | None:
    """HOOKLINE_CONSOLE_CSRF_KEY_FILE: the key every replica signs the pages' CSRF tokens with, so that
    a form one replica rendered is accepted by another; None when unset (a key made per process). The
    file holds at least 32 printable ASCII characters without spaces (one trailing newline allowed).
    Read once, at start; errors name the file, never its content."""
    configured = environ.get(CONSOLE_CSRF_KEY_FILE, "").strip()
    if not configured:
        return None
    path = Path(configured)
    try:
        text = path.read_bytes().decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"{CONSOLE_CSRF_KEY_FILE}: {path} is not a key: it holds bytes other than ASCII "
                          "(make one with `openssl rand -hex 32`)") from None
    except OSError as exc:
        raise ConfigError(f"{CONSOLE_CSRF_KEY_FILE}: cannot read {path}: {exc.strerror or exc}") from None
    key = text.removesuffix("\n").removesuffix("\r")
    if len(key) < MIN_CSRF_KEY_CHARS:
        raise ConfigError(f"{CONSOLE_CSRF_KEY_FILE}: the key in {path} is too short: give at least "
                          f"{MIN_CSRF_KEY_CHARS} characters (`openssl rand -hex 32`)")
    if not CSRF_KEY_PATTERN.fullmatch(key):
        raise ConfigError(f"{CONSOLE_CSRF_KEY_FILE}: {path} is not a key: it must be one line of printable "
                          "characters without spaces (make one with `openssl rand -hex 32`)")
    return key.encode()


def log_settings(args: argparse.Namespace, terminal: bool) -> LogSettings:
    """The log settings of any ``hookline`` command: text for `hookline dev` and on a terminal."""
    return LogSettings.read(getattr(args, "log_level", None), for_people=args.command == "dev", terminal=terminal)

