"""``hookline dev``: the whole stack in one process on an embedded Postgres."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.resources
import logging
import os
import shlex
import shutil
import socket
import sys
from pathlib import Path

from hookline import devstack
from hookline.core import db, migrations, secrets_at_rest, stored_secrets
from hookline.core.config import ConfigError
from hookline.core.embedded import EmbeddedPostgres, free_port
from hookline.core.providers import Provider, ProviderRegistry, SpecError, apply_providers
from hookline.core.sample_event import sample_request
from hookline.core.settings import Settings, keys_file
from hookline.handler_imports import handler_problem

log = logging.getLogger("hookline.dev")


DATABASE = "hookline"


def _stable_port(data_dir: Path) -> int:
    """Reuse the last port so the printed database URL stays the same across restarts."""
    port_file = data_dir / "postgres.port"
    if port_file.exists():
        return int(port_file.read_text())
    port = free_port()
    port_file.write_text(str(port))
    return port


async def _ensure_database(server_url: str) -> None:
    conn = await db.connect(server_url)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE):
            await conn.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await conn.close()


def curl_example(receiver_url: str, provider: Provider) -> str | None:
    """A ready-to-paste curl command carrying a valid signature for ``provider`` (a new event,
    valid for the provider's toleranceSeconds where its scheme signs a timestamp)."""
    if not provider.signature.secrets and provider.signature.scheme != "none":
        return None
    return sample_request(provider).curl(receiver_url)


async def _prepare_database(url: str, providers_file: Path | None) -> None:
    """Migrate, then apply the providers file (the example one when none is given)."""
    conn = await db.connect(url)
    try:
        await migrations.migrate(conn)
        for line in await stored_secrets.seal_plaintext(conn):
            print(line, flush=True)
        if providers_file:
            text = await asyncio.to_thread(providers_file.read_text)
        else:
            text = importlib.resources.files("hookline.examples").joinpath("providers.yaml").read_text()
        try:
            for line in await apply_providers(conn, text, handler_problem):
                print(line, flush=True)
        except SpecError as exc:
            raise ConfigError(f"{providers_file or 'example providers'}: {exc}") from None
    finally:
        await conn.close()


def _print_welcome(receiver_url: str, database_url: str, registry: ProviderRegistry,
                   console: tuple[str, str | None] | None = None) -> None:
    """``console``: its URL and token (printed here, never logged: whoever has this terminal may use it)."""
    shown = "" if console is None else (f"  console:   {console[0]}/  (API {console[0]}/api/v1"
                                        + (f", token {console[1]})\n" if console[1] else ")\n"))
    print(f"\nHookline is running.\n  receiver:  {receiver_url}/webhooks/<provider>\n"
          f"  database:  {database_url}\n  metrics:   {receiver_url}/metrics\n{shown}", flush=True)
    for provider in registry.all().values():
        example = curl_example(receiver_url, provider)
        if example:
            print(f"Send a signed test event to '{provider.name}' (this one is valid for "
                  f"{provider.signature.tolerance_seconds} s; `hookline send-test {provider.name}` sends a new "
                  f"one any time):\n  {example}\n", flush=True)
    print(_cli_hint(database_url), flush=True)
    print("Press Ctrl-C to stop.", flush=True)


def _cli_hint(database_url: str) -> str:
    """How another shell's `hookline` reaches this stack: on PATH, and its database."""
    data_dir = devstack.data_dir()
    where = "from this directory" if data_dir == devstack.DEFAULT_DATA_DIR.resolve() else \
        f"with {devstack.DATA_DIR_ENV}={shlex.quote(str(data_dir))}"
    lines = [f"In another shell, {where}, every `hookline` command finds this stack (with "
             "HOOKLINE_DATABASE_URL unset);"]
    if not _on_path():
        activate = Path(sys.prefix) / "bin" / "activate"
        with contextlib.suppress(ValueError):
            activate = activate.relative_to(Path.cwd())
        lines[0] += f" put `hookline` on PATH first:\n  . {shlex.quote(str(activate))}"
    else:
        lines[0] += " e.g.:"
    lines += ["  hookline status", "From anywhere else:",
              f"  export HOOKLINE_DATABASE_URL={shlex.quote(database_url)}",
              f"  export {secrets_at_rest.KEYS_FILE_ENV}="
              f"{shlex.quote(str(keys_file() or ''))}", ""]
    return "\n".join(lines)


def _on_path() -> bool:
    """Whether `hookline` on PATH is this interpreter's."""
    found = shutil.which("hookline")
    return found is not None and Path(found).resolve().parent == (Path(sys.prefix) / "bin").resolve()


async def _run_stack(settings: Settings, url: str) -> None:
    """Receiver, worker (which also sweeps leases) and relay on one Host: one pool, one LISTEN connection."""
    from hookline.console.service import Console
    from hookline.core.host import Component, Host
    from hookline.receiver.app import Receiver
    from hookline.relay.service import Relay
    from hookline.worker.service import Worker

    with_console = settings.console.port != 0

    def welcome(host: Host) -> None:
        assert host.registry is not None  # the receiver and the worker read providers
        receiver = settings.receiver
        console = host.component(Console) if with_console else None
        _print_welcome(f"http://{receiver.host}:{receiver.port}", url, host.registry,
                       None if console is None else (console.url, console.token))

    components: list[type[Component]] = [Receiver, Worker, Relay, *([Console] if with_console else [])]
    await Host(dataclasses.replace(settings, database_url=url), components).run(welcome)


def use_keys_file(data_dir: Path) -> Path:
    """The key file that encrypts secrets at rest: HOOKLINE_SECRET_KEYS_FILE when set, else
    ``secret-keys`` in the data dir (made with a new key, mode 0600, on first use), which every
    part of the stack (and the CLI, told the same path) then reads."""
    configured = keys_file()
    path = configured or data_dir / "secret-keys"
    if configured is None and not path.exists():
        secrets_at_rest.write_new_keys_file(path)
    os.environ[secrets_at_rest.KEYS_FILE_ENV] = str(path)
    secrets_at_rest.required_ring("hookline dev")  # a bad file stops here, with its reason
    return path


def _port_taken(host: str, port: int) -> str | None:
    """Why the receiver could not listen on host:port, before anything else is started for it."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


async def run_dev(args: argparse.Namespace) -> int:
    if (problem := _port_taken(args.host, args.port)) is not None:
        print(f"hookline dev: cannot listen on {args.host}:{args.port} ({problem}; another hookline dev?): "
              "choose another port with --port", file=sys.stderr)
        return 1
    settings = Settings.for_command(args)  # a bad variable stops here, before Postgres starts
    data_dir: Path = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    keys_file = use_keys_file(data_dir)
    print(f"signing secrets are encrypted at rest with the keys in {keys_file} (for the CLI: "
          f"export {secrets_at_rest.KEYS_FILE_ENV}={shlex.quote(str(keys_file))})", flush=True)
    server = EmbeddedPostgres(data_dir, port=_stable_port(data_dir))
    log.info("starting embedded Postgres", extra={"data_dir": str(data_dir)})
    try:
        await asyncio.to_thread(server.start)
    except RuntimeError as exc:  # another dev owns it, or Postgres would not start: its log says why
        print(f"hookline dev: {exc}", file=sys.stderr)
        return 1
    try:
        await _ensure_database(server.url)
        url = server.url_for(DATABASE)
        await _prepare_database(url, args.providers)
        devstack.record(data_dir, url, devstack.receiver_url(args.host, args.port), keys_file)
        os.environ[devstack.DATA_DIR_ENV] = str(data_dir)  # for the banner's hint
        try:
            await _run_stack(settings, url)
        finally:
            devstack.forget(data_dir)
    finally:
        await asyncio.to_thread(server.stop)
        print("stopped.", flush=True)
    return 0
