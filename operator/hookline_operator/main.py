"""``hookline operator``: run kopf with Hookline's handlers."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import socket


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hookline.cli import _positive  # the CLI's number checks (a usage error, not a traceback)

    p.add_argument("-n", "--namespace", action="append", dest="namespaces", metavar="NS",
                   help="watch this namespace (repeatable; like kopf run)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                   help="where to serve /healthz (and /readyz, /metrics on the same port), as kopf run's "
                        "liveness URL (default http://0.0.0.0:8080/healthz; empty: no HTTP server)")
    p.add_argument("--interval", type=_positive(float), default=10.0,
                   help="seconds between status refreshes, scaling decisions and lease sweeps (default 10)")
    p.add_argument("--peering", action="store_true",
                   help="use kopf peering (needs KopfPeering RBAC); the default is standalone: run one replica")


def run(args: argparse.Namespace) -> int:
    """Run the operator (the CLI has checked that namespaces, or --all-namespaces, were given)."""
    import kopf

    from hookline.core import secrets_at_rest
    from hookline.core.settings import database_password_file, database_url, session_password_file, transaction_pooling
    from hookline_operator import handlers
    from hookline_operator.memo import OperatorMemo

    database_url()  # fail fast with a clear message when it is not set
    database_password_file()  # and when its password file is unreadable (its connections read it: core/db.py)
    transaction_pooling()  # and when a transaction-mode URL has no session URL beside it
    session_password_file()  # (which is checked as HOOKLINE_DATABASE_URL is)
    # It stores every provider's signing secrets and mirrors destination secrets: not without the key.
    secrets_at_rest.required_ring("the operator")
    check_settings()
    os.environ.setdefault("POD_ID", own_identity())
    try:
        asyncio.run(kopf.operator(
            registry=handlers.register(args.interval),
            standalone=not args.peering,
            clusterwide=args.all_namespaces,
            namespaces=args.namespaces or (),
            # Our own server answers /healthz, /readyz and /metrics (started with the pool).
            liveness_endpoint=None,
            memo=OperatorMemo(interval=args.interval, http_url=args.liveness or None),
        ))
    except Exception as exc:  # kopf raises its (private) ActivityError when a startup handler failed
        if (config := _config_cause(exc)) is None:
            raise
        raise config from None
    return 0


def _config_cause(exc: BaseException) -> BaseException | None:
    """The ConfigError a failed startup handler was raised from (handlers.startup), if any."""
    from hookline.core.config import ConfigError

    cause = exc.__cause__
    while cause is not None and not isinstance(cause, ConfigError):
        cause = cause.__cause__
    return cause


def own_identity() -> str:
    """kopf names this process by POD_ID (the chart sets the pod's name), else ``user@host`` from
    getpass.getuser(), which raises for a numeric user with no passwd entry, as in our image."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def check_settings() -> None:
    """The chart's settings for workers, read once at start so a mistake stops the operator with its
    message (a ConfigError, one line from the CLI) instead of failing every reconciliation."""
    from hookline.core.config import ConfigError
    from hookline_operator import budget, podtemplate, tenancy

    try:
        podtemplate.configured_template()
    except podtemplate.TemplateError as exc:
        raise ConfigError(str(exc)) from None
    tenancy.configured_handler_modules()
    budget.configured_budget()
