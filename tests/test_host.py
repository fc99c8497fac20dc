"""The Host (core/host.py): each `hookline` service's pool sized as pools.py says, one maintainer per
scope with its components' jobs, and every dedicated connection opened from the database URL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import asyncpg
import pytest

from hookline.cli import build_parser
from hookline.core import pools
from hookline.core.embedded import free_port
from hookline.core.host import Connections, Host, Wiring
from hookline.core.maintenance import Job
from hookline.core.settings import ReceiverSettings, RelaySettings, Settings, WorkerSettings
from hookline.receiver.app import Receiver
from hookline.relay.service import Relay
from hookline.worker.service import Worker
from support.waiting import eventually

ENVIRON = {"HOOKLINE_DATABASE_URL": "postgresql://hookline@db/hookline"}
COMPONENTS: dict[str, list[type[Receiver] | type[Worker] | type[Relay]]] = {
    "receiver": [Receiver], "worker": [Worker], "relay": [Relay], "dev": [Receiver, Worker, Relay]}


def host_for(*argv: str) -> Host:
    args = build_parser().parse_args(list(argv))
    return Host(Settings.for_command(args, ENVIRON), COMPONENTS[args.command])  # type: ignore[arg-type]


@pytest.mark.parametrize(("argv", "size", "smallest", "scopes"), [
    # (command line, pool size, connections opened at start, maintenance scopes)
    (["receiver"], 5, 5, ()),
    (["receiver", "--db-connections", "12"], 13, 13, ()),
    (["worker"], 19, 2, ("inbox",)),
    (["worker", "--concurrency", "4", "--sweep"], 7, 2, ("inbox", "partitions")),
    (["relay"], 17, 1, ("outbox", "partitions")),
    (["relay", "--concurrency", "8"], 9, 1, ("outbox", "partitions")),
    (["dev"], 36, 1, ("inbox", "partitions", "outbox")),
])
def test_each_service_sizes_its_pool_as_before(argv: list[str], size: int, smallest: int,
                                                scopes: tuple[str, ...]) -> None:
    """The sizes each command had before the Host (the chart and the operator's budget count them)."""
    host = host_for(*argv)
    assert (host.pool_size, host.pool_min, host.scopes) == (size, smallest, scopes)


@pytest.mark.parametrize("argv", [["receiver"], ["worker"], ["worker", "--sweep"], ["relay", "--concurrency", "40"]])
def test_a_service_holds_what_pools_counts_for_it(argv: list[str]) -> None:
    """Pool, LISTEN and one lease connection per scope add up to what core/pools.py counts per pod."""
    host = host_for(*argv)
    args = build_parser().parse_args(argv)
    budget = {"receiver": lambda: pools.receiver(args.db_connections),
              "worker": lambda: pools.worker(args.concurrency) + (1 if args.sweep else 0),
              "relay": lambda: pools.relay(args.concurrency)}[args.command]()
    assert host.pool_size + pools.LISTEN + len(host.scopes) * pools.LEADER_LOCK == budget


async def backends(pool: asyncpg.Pool, application_name: str) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                                   application_name))


async def test_one_maintainer_per_scope_and_dedicated_connections_from_the_url(database_url: str,
                                                                              pool: asyncpg.Pool) -> None:
    """The whole stack on one Host (as `hookline dev`): the partition manager that the sweeping worker
    and the relay both contribute runs once; the listener and each elected scope hold a connection of
    their own, outside the pool."""
    name = "host-test"
    settings = Settings(f"{database_url}?application_name={name}",
                        receiver=ReceiverSettings(host="127.0.0.1", port=free_port()),
                        worker=WorkerSettings(concurrency=2, sweep=True),
                        relay=RelaySettings(concurrency=2, allow_private_networks=True))
    host = Host(settings, [Receiver, Worker, Relay])
    await host.start()
    try:
        jobs = {m.scope: sorted(job.name for job in m.jobs) for m in host.maintainers}
        assert jobs == {"inbox": ["inbox-stats", "lease-rescuer:hookline.inbox"],
                        "partitions": ["partition-manager"],
                        "outbox": ["circuit-counts", "lease-rescuer:hookline.deliveries", "outbox-stats"]}
        assert host.listener is not None and host.pool is not None
        await eventually(host.listener.connected.is_set, what="the listener connected")
        await asyncio.gather(*(m.leader.wait() for m in host.maintainers))  # the only process: it leads each
        opened = host.pool

        async def all_counted() -> bool:  # the pool may grow meanwhile: counted again until it holds still
            return await backends(pool, name) == opened.get_size() + 1 + len(host.maintainers)

        # Pool connections, the LISTEN and one lease per scope: every backend of this process.
        await eventually(all_counted, what="every backend of this process counted")
    finally:
        await host.stop()
    assert await backends(pool, name) == 0


def test_hookline_dev_runs_the_whole_stack_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    """The real program: `hookline dev` prints its banner, the printed signed curl is accepted and the
    worker handles the event (its log line), and Ctrl-C stops everything (exit 0)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "HOOKLINE_SECRET_KEYS_FILE"}  # dev makes its own
    proc = subprocess.Popen([sys.executable, "-m", "hookline", "dev", "--port", str(port), "--data-dir",
                             str(tmp_path / "dev")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    watchdog = threading.Timer(180, proc.kill)  # a stack that never gets there fails the test, not the suite
    watchdog.start()
    try:
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        banner = "".join(lines)
        assert f"receiver:  http://127.0.0.1:{port}/webhooks/<provider>" in banner, banner
        # The console is part of it, on its port, guarded by the token the banner shows.
        console_line = next(line for line in lines if line.strip().startswith("console:"))
        console_url, token = console_line.split()[1].rstrip("/"), console_line.split()[-1].rstrip(")")
        request = urllib.request.Request(console_url + "/api/v1/providers",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200 and json.loads(r.read())["items"], console_line
        curl = next(line.strip() for line in lines if line.strip().startswith("curl "))
        answer = subprocess.run(curl, shell=True, capture_output=True, text=True, timeout=30, check=True)
        assert '"status": "accepted"' in answer.stdout or '"status":"accepted"' in answer.stdout, answer.stdout
        for line in proc.stdout:  # the worker's handler logs it
            lines.append(line)
            if "handled event" in line:
                break
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()
        assert proc.wait(60) == 0, "".join(lines) + rest
        assert "stopped." in rest and "Traceback" not in "".join(lines) + rest
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class StopFails:
    """A component whose stop raises: the Host must still stop everything else."""

    stopped: list[str] = []

    @classmethod
    def connections(cls, settings: Settings) -> Connections:
        return Connections(pools.LISTEN + 2)

    @classmethod
    def create(cls, wiring: Wiring) -> StopFails:
        return cls()

    def jobs(self) -> list[tuple[str, Job]]:
        return []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        StopFails.stopped.append("failing")
        raise RuntimeError("cannot stop")


class StopsCleanly(StopFails):
    async def stop(self) -> None:
        StopFails.stopped.append("clean")


async def test_one_part_that_fails_to_stop_does_not_keep_the_others_open(database_url: str,
                                                                          pool: asyncpg.Pool) -> None:
    name = "host-stop-test"
    host = Host(Settings(f"{database_url}?application_name={name}"), [StopsCleanly, StopFails])  # type: ignore[list-item]
    await host.start()
    assert await backends(pool, name) > 0
    await host.stop()
    assert StopFails.stopped == ["failing", "clean"]  # the reverse order, and on past the failure
    await eventually(lambda: backends(pool, name), equals=0, what="no connection left open")
