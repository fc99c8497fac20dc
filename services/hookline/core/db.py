"""The thin connector layer: connection pools, and the SQL loader for every ``sql/*.sql`` file.

Each statement lives in a ``.sql`` file under a ``-- name: <statement>`` header, so it can be
read, reviewed, run and EXPLAINed as SQL rather than as Python strings. A statement shared by
several tables (``queue.sql``) is a template whose holes are SQL comments, after River's
sqlctemplate, so the file as written is valid SQL that runs against the defaults:

* ``/* TEMPLATE: name */default`` — the default that follows the marker (an identifier such as
  ``hookline.inbox``, or a quoted literal) is replaced by the value of ``name``;
* ``/* TEMPLATE_BEGIN: name */ ... /* TEMPLATE_END */`` — an optional part, kept when ``name``
  is true and dropped when it is false; sections may nest.

Values are identifiers or literals written by our code, checked as such: parameters stay
``$n`` parameters. Files are read once and each rendering is cached.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import os
import re
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg

from hookline.core import metrics
from hookline.core.config import ConfigError, redact_url
from hookline.core.settings import (
    database_password_file,
    database_session_url,
    database_url,
    read_password_file,
    session_password_file,
    transaction_pooling,
)

_QUERY_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_DEFAULT = r"[A-Za-z_][\w.]*|'[^'\\]*'"
_MARKER = re.compile(rf"/\* TEMPLATE: (\w+) \*/(?:{_DEFAULT})")
# A section with no section inside it: nested sections are rendered from the inside out.
_SECTION = re.compile(r"/\* TEMPLATE_BEGIN: (\w+) \*/((?:(?!/\* TEMPLATE_BEGIN:).)*?)/\* TEMPLATE_END \*/", re.DOTALL)
_VALUE = re.compile(_DEFAULT)
_BLANKED_LINE = re.compile(r"\n[ \t]+(?=\n)")  # what a dropped section leaves of its line

TemplateValue = str | bool

# What a statement raises when Postgres, or the connection to it, fails: retry later, never a bad
# event. asyncpg's InternalClientError is not an InterfaceError, yet a statement sent on a
# connection the server has just ended (pg_terminate_backend, a restart) can raise it: "cannot
# switch to state 12; another operation (2) is in progress" (seen in make test, 2026-12-01).
DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)


def parse_queries(text: str) -> dict[str, str]:
    parts = _QUERY_HEADER.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


@functools.cache
def statements(filename: str = "queries.sql") -> dict[str, str]:
    """Every statement of ``sql/<filename>`` by name, as written (templates unrendered)."""
    text = importlib.resources.files("hookline.core").joinpath(f"sql/{filename}").read_text()
    return parse_queries(text)


def render(sql: str, values: dict[str, TemplateValue], where: str = "statement") -> str:
    """``sql`` with its template sections kept or dropped and its markers replaced."""

    def section(match: re.Match[str]) -> str:
        name, body = match[1], match[2]
        keep = _value(name, values, where)
        if not isinstance(keep, bool):
            raise TypeError(f"{where}: template section {name!r} takes true or false, not {keep!r}")
        return body if keep else ""

    def marker(match: re.Match[str]) -> str:
        value = _value(match[1], values, where)
        if not isinstance(value, str) or not _VALUE.fullmatch(value):
            raise ValueError(f"{where}: template value {match[1]}={value!r} is not an identifier or a quoted literal")
        return value

    rendered, sections = sql, 1
    while sections:
        rendered, sections = _SECTION.subn(section, rendered)
    rendered = _BLANKED_LINE.sub("", _MARKER.sub(marker, rendered))
    if re.search(r"/\*\s*TEMPLATE", rendered):
        raise ValueError(f"{where}: a template marker is malformed (want /* TEMPLATE: name */default or "
                         "/* TEMPLATE_BEGIN: name */ ... /* TEMPLATE_END */)")
    return rendered


def _value(name: str, values: dict[str, TemplateValue], where: str) -> TemplateValue:
    try:
        return values[name]
    except KeyError:
        raise KeyError(f"{where} needs the template value {name!r}") from None


@functools.cache
def _rendered(filename: str, name: str, values: tuple[tuple[str, TemplateValue], ...]) -> str:
    try:
        sql = statements(filename)[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in hookline/core/sql/{filename}") from None
    return render(sql, dict(values), f"{name} in {filename}")


def query(name: str, filename: str = "queries.sql", /, **template: TemplateValue) -> str:
    """The SQL text of the named statement of ``sql/<filename>`` (``queries.sql`` by default),
    its template holes filled from ``template`` (see the module docstring)."""
    return _rendered(filename, name, tuple(sorted(template.items())))


async def _init_connection(conn: asyncpg.Connection) -> None:
    # JSON columns come back as Python objects rather than strings.
    for typ in ("json", "jsonb"):
        await conn.set_type_codec(
            typ, schema="pg_catalog", encoder=_json_dumps, decoder=_json_loads, format="text"
        )


# One encoder for every value: json.dumps with any option builds a new JSONEncoder per call.
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _json_dumps(value: Any) -> str:
    return _JSON_ENCODER.encode(value)


def _json_loads(value: str) -> Any:
    return json.loads(value)


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Skip asyncpg's reset query on release (it still aborts open transactions and drops listeners)."""


# The search path of connections that run only Hookline's own statements (receiver, relay, operator,
# the CLI, LISTEN and leader connections): nothing any role created in schema public can stand in for
# a built-in function there. Workers keep the role's path, as handlers name their own tables.
PINNED_SEARCH_PATH = {"search_path": "pg_catalog, pg_temp"}


# What a ``generic_plans`` pool sets for its sessions (and, second, Postgres's default, which a
# handler's transaction sets back: worker/processing.py). A generic plan is made once, for the tables
# as they are then, and kept: one made while today's partition was empty (a new day; a queue drained
# and vacuumed) read that partition whole on every claim, and sorted every pending row, as the
# partition filled, until a VACUUM or ANALYZE of it happened to invalidate the plan (issue 26). Every
# statement Hookline runs on these pools finds its rows through an index; without sequential scans
# and sorts where an index path exists, a plan made for an empty table stays right for a full one.
# No JIT either: a plan left with a disabled scan or sort (a partition with no index for it) carries
# its "disabled" cost of 1e10, far past jit_above_cost, so Postgres built with LLVM (Debian's, most
# clouds'; not the embedded one) compiled such statements each time: the relay's claim took 4.4 s.
GENERIC_PLAN_SETTINGS = {
    "plan_cache_mode": ("force_generic_plan", "auto"),
    "enable_seqscan": ("off", "on"),
    "enable_sort": ("off", "on"),
    "jit": ("off", "on"),
}
# The same as ``SET LOCAL``s, for a transaction on such a pool: Postgres's defaults (a handler's
# code), and the pool's again (Hookline's statements after a handler's, in its transaction).
DEFAULT_PLAN_SETTINGS_LOCAL = "; ".join(f"SET LOCAL {name} = {default}"
                                        for name, (_, default) in GENERIC_PLAN_SETTINGS.items())
GENERIC_PLAN_SETTINGS_LOCAL = "; ".join(f"SET LOCAL {name} = {value}"
                                        for name, (value, _) in GENERIC_PLAN_SETTINGS.items())


def connection_lost(conn: asyncpg.Connection) -> bool:
    """True once the server has ended ``conn`` (a failover, a restart, pg_terminate_backend). The
    pool takes such a connection back at once and every later call on it raises InterfaceError
    ("released back to the pool"), so a batch must send nothing more on it: its whole transaction
    is gone, and a failure seen on it is the connection's, not the handler's."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:  # released already
        return True


class PasswordFile:
    """asyncpg's ``password`` when the password lives in a file (HOOKLINE_DATABASE_PASSWORD_FILE):
    asyncpg calls it for each connection it opens, a pool's included, so a token a sidecar or CSI
    driver rewrites in place is used from the next connection on; open connections keep theirs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> str:
        # Read in the event loop, not a thread: a few bytes from a local (tmpfs) file, once per new
        # connection, cost less than handing them to a thread would. What cannot be read raises an
        # OSError (PasswordFileError included): one of DATABASE_ERRORS, retried as callers retry those.
        return read_password_file(self.path)

    def __repr__(self) -> str:  # the path only: the value must never reach a log
        return f"PasswordFile({str(self.path)!r})"


def connect_arguments(url: str | None = None, password_file: Path | None = None, *,
                      session: bool = False) -> dict[str, Any]:
    """Where asyncpg.connect and asyncpg.create_pool connect: ``url`` (None: HOOKLINE_DATABASE_URL, with
    HOOKLINE_DATABASE_PASSWORD_FILE; with ``session``, HOOKLINE_DATABASE_SESSION_URL first) and, given a
    password file, the password read from it for each new connection. The one place that says so: every
    connection Hookline opens is opened from these."""
    if not url:
        session_url = None
        if session:
            # Refuses a transaction-mode URL with no session URL beside it: a session's statements
            # there would run on whichever server session each transaction is given.
            transaction_pooling()
            session_url = database_session_url()
        url, password_file = (session_url, session_password_file()) if session_url else (
            database_url(), database_password_file())
    return {"dsn": url, **({"password": PasswordFile(password_file)} if password_file is not None else {})}


def _set_statement(settings: dict[str, str]) -> str:
    # SET rather than start-up parameters, which a pooler rejects (PgBouncer: "unsupported startup
    # parameter") or drops (its ignore_startup_parameters); a session-mode pooler keeps a SET for as
    # long as the client holds its server connection. Names and values are Hookline's constants.
    return "; ".join(f"SET {name} = {value}" for name, value in settings.items())


def _session_setup(settings: dict[str, str]) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    """The ``init`` of a new connection: ``settings`` as session SETs, and Hookline's codecs."""
    statement = _set_statement(settings)

    async def init(conn: asyncpg.Connection) -> None:
        if statement:
            await conn.execute(statement)
        await _init_connection(conn)

    return init


def _reset_keeping(settings: dict[str, str]) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    """The ``reset`` of a pool that is not lean but has ``settings``: asyncpg's own (its RESET ALL
    undoes SETs too), then the SETs again."""
    statement = _set_statement(settings)

    async def reset(conn: asyncpg.Connection) -> None:
        await conn.reset()
        await conn.execute(statement)

    return reset


async def create_pool(
    url: str | None = None, *, password_file: Path | None = None, min_size: int = 1, max_size: int = 10,
    command_timeout: float = 30.0, lean: bool = False, generic_plans: bool = False, pinned_search_path: bool = False,
    transaction_pooling: bool = False,
) -> asyncpg.Pool:
    """A pool with Hookline's type codecs; ``url`` and ``password_file``: see connect_arguments.

    ``lean`` pools skip the per-release ``RESET ALL; UNLISTEN *; ...`` round trip, which
    costs a service as much as the statement it runs. Code on such a pool (handlers
    included) must not leave session state behind: use ``SET LOCAL``, not ``SET``.

    ``generic_plans`` pools plan each prepared statement once (``plan_cache_mode =
    force_generic_plan``), with no sequential scan or sort where an index serves
    (GENERIC_PLAN_SETTINGS). Postgres otherwise keeps planning a statement afresh whenever
    it guesses a plan for the given values is cheaper: the queue's claim, over every
    inbox partition, was planned on every call (0.9 ms of server CPU, more than it took
    to run). Hookline's statements are written for generic plans (no value-dependent
    shapes); code of others on such a pool (handlers) sets Postgres's defaults back in its
    transaction (``SET LOCAL``, ``hookline.worker.processing``).

    ``pinned_search_path``: see PINNED_SEARCH_PATH.

    ``transaction_pooling``: ``url`` goes through a transaction-mode pooler (settings.transaction_pooling),
    where consecutive transactions of one connection may run on different server sessions: no named
    prepared statements (asyncpg's statement cache off: it then uses the unnamed statement, planned at
    each execution) and no session SETs, which would stay behind on a server connection that the
    pooler hands to other clients (a worker's handlers run on the role's own search path). Neither
    ``generic_plans`` nor ``pinned_search_path`` applies then (docs/postgres.md, poolers).
    """
    settings = {} if transaction_pooling else {
        **({name: value for name, (value, _) in GENERIC_PLAN_SETTINGS.items()} if generic_plans else {}),
        **(PINNED_SEARCH_PATH if pinned_search_path else {})}
    arguments = connect_arguments(url, password_file)
    try:
        pool = await asyncpg.create_pool(
            **arguments,
            min_size=min_size,
            max_size=max_size,
            command_timeout=command_timeout,
            init=_session_setup(settings),
            **({"reset": _keep_session} if lean else {"reset": _reset_keeping(settings)} if settings else {}),
            **({"statement_cache_size": 0} if transaction_pooling else {}),
        )
    except DATABASE_ERRORS as exc:
        if (problem := _configuration_error(exc, arguments["dsn"])) is not None:
            raise problem from None
        raise
    assert pool is not None
    metrics.track_pool(pool)
    return pool


async def connect(url: str | None = None, *, password_file: Path | None = None,
                  pinned_search_path: bool = False) -> asyncpg.Connection:
    """A single connection with a session of its own (for LISTEN, leader leases, migrations and one-shot
    commands); ``url`` and ``password_file``: see connect_arguments (None: the session URL)."""
    arguments = connect_arguments(url, password_file, session=True)
    try:
        conn = await asyncpg.connect(**arguments)
    except DATABASE_ERRORS as exc:
        if (problem := _configuration_error(exc, arguments["dsn"])) is not None:
            raise problem from None
        raise
    await _session_setup(PINNED_SEARCH_PATH if pinned_search_path else {})(conn)
    return conn


class ConnectionConfigError(ConfigError, OSError):
    """A connection failed for a reason of configuration, not an outage: TLS (a server certificate that
    does not verify against sslrootcert, or does not name the URL's host; a certificate or key file that
    cannot be read or is refused). Its message is one line: the URL (redacted), the host, the file.

    A ConfigError, so that a command or service meeting it at start exits at once with that line
    (cli.py, exit status 2): retrying cannot help, and a restarting pod shows the line in its log, under
    its orchestrator's back-off. An OSError too (as ssl.SSLCertVerificationError is): a connection lost
    later and reopened (LISTEN, leader leases) goes on retrying with back-off as for an outage, as a
    running service should while someone rotates a CA."""


# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_NAME_MISMATCH = (62, 64)
_TLS_FILES = ("sslrootcert", "sslcert", "sslkey", "sslcrl")


def _tls_parameters(url: str) -> dict[str, str]:
    """The URL's TLS parameters (libpq's names), with asyncpg's PGSSL* fallbacks."""
    query = {name: values[-1] for name, values in parse_qs(urlsplit(url).query).items()}
    found = {name: query[name] for name in ("sslmode", *_TLS_FILES) if query.get(name)}
    for name in _TLS_FILES:
        if name not in found and (value := os.environ.get(f"PG{name.upper()}")):
            found[name] = value
    return found


def _hosts(url: str) -> str:
    """The URL's host for a message; a multi-host URL's every host (asyncpg tries each in turn and
    raises the last one's error, so the message cannot say which refused: each is named)."""
    netloc = urlsplit(url).netloc.rpartition("@")[2]
    names = [urlsplit(f"//{part}").hostname or part for part in netloc.split(",") if part]
    if len(names) > 1:
        return f"{names[-1]} (the last of {', '.join(names)} tried)"
    return names[0] if names else "the default host"


def tls_problem(exc: BaseException, url: str) -> str | None:
    """What is wrong with ``url``'s TLS setup, given the error a connection to it raised; None when the
    error is not one of TLS configuration (an outage, a wrong password, ...)."""
    tls = _tls_parameters(url)
    host = _hosts(url)
    root = tls.get("sslrootcert", "~/.postgresql/root.crt (no sslrootcert given)")
    if isinstance(exc, ssl.SSLCertVerificationError):
        if exc.verify_code in _NAME_MISMATCH:
            return (f"the server's TLS certificate is not valid for host {host} ({exc.verify_message}): "
                    f"sslmode=verify-full checks the URL's host against the certificate's names; connect by "
                    "a name the certificate carries")
        return (f"the server's TLS certificate for host {host} did not verify against sslrootcert {root} "
                f"(certificate verify failed: {exc.verify_message}): set sslrootcert to the CA bundle that "
                "signed the server's certificate")
    if isinstance(exc, asyncpg.ClientConfigurationError):  # sslmode=verify-* with no root certificate to use
        return f"TLS configuration for host {host}: {exc}"
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return None  # the connection ended mid-handshake: an outage as any other
    if isinstance(exc, ssl.SSLError):  # a certificate or key file refused, or the server refused ours
        files = ", ".join(f"{name} {tls[name]}" for name in _TLS_FILES if name in tls) or "no certificate files"
        return f"TLS with host {host} failed ({exc.reason or exc}) with {files}"
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError | TimeoutError):
        for name in _TLS_FILES:
            if name in tls and not os.access(tls[name], os.R_OK):
                return f"{name} {tls[name]} cannot be read ({exc.strerror or exc})"
    return None


def _configuration_error(exc: BaseException, url: str) -> ConnectionConfigError | None:
    problem = tls_problem(exc, url)
    return ConnectionConfigError(f"cannot connect to {redact_url(url)}: {problem}") if problem else None
