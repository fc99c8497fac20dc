"""A pg_auto_failover formation on loopback for failover tests: a monitor and two Postgres 15 nodes,
a primary and a synchronous standby (tests/test_failover.py).

Each ``pg_autoctl`` runs in a session of its own as the system user Postgres runs as (root cannot
run Postgres; see core/embedded.py), so that ``kill_primary`` can SIGKILL a node's keeper, its
postmaster and the backends together, as a machine that dies would. Authentication is ``trust``:
the formation listens on 127.0.0.1 only, lives in a private temporary directory and is removed at
teardown, and trust spares a password for the monitor, replication and the services (TLS and
passwords are what docs/postgres.md's other sections test). No TLS (``--no-ssl``) for the same reason.

The monitor is told to give up on a silent primary quickly (``FAST_FAILOVER``): it checks each
node every second, a check fails after a second without retry, and a node not heard from for
three seconds is unhealthy; with the keeper's own second-long loop, a standby is promoted some
within about 7 s of the kill (with the defaults: 50 s and more).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from hookline.core.embedded import SYSTEM_USER, _ensure_user, free_port
from support.engines import pg_autoctl, postgres_15
from support.waiting import eventually_sync

MONITOR_DB = "pg_auto_failover"
# Monitor settings (milliseconds) that make it declare a primary dead within a few seconds.
FAST_FAILOVER = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 1000,
    "pgautofailover.health_check_max_retries": 1,
    "pgautofailover.health_check_retry_delay": 500,
    "pgautofailover.node_considered_unhealthy_timeout": 3000,
    # How long the monitor waits for a primary it cannot reach to demote itself before promoting its
    # standby (30 s by default). Safe to shorten here only because the old primary is dead; where it
    # may merely be cut off, it must stay above the keepers' network_partition_timeout (20 s).
    "pgautofailover.primary_demote_timeout": 3000,
}


class Formation:
    """Start with :meth:`start`; always :meth:`stop` (kills everything, removes the files)."""

    def __init__(self, database: str = "hookline") -> None:
        self.database = database
        self._autoctl = pg_autoctl()
        self._bin = postgres_15() / "bin"
        self._run_as = SYSTEM_USER if os.geteuid() == 0 else None
        self.root = Path(tempfile.mkdtemp(prefix="hookline-ha-"))
        self.monitor_port = free_port()
        self.ports = {"node1": free_port(), "node2": free_port()}
        self._processes: dict[str, subprocess.Popen[bytes]] = {}

    # -- addresses ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """What every Hookline process is given: both nodes, the writable one chosen at connect."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports.values())
        return f"postgresql://{self._role}@{hosts}/{self.database}?target_session_attrs=read-write"

    def node_url(self, node: str, database: str | None = None) -> str:
        return f"postgresql://{self._role}@127.0.0.1:{self.ports[node]}/{database or self.database}"

    @property
    def _role(self) -> str:
        return self._run_as or os.environ.get("USER", "postgres")

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Formation:
        if self._run_as:
            _ensure_user(self._run_as)
            shutil.chown(self.root, self._run_as, self._run_as)
        self._create_and_run("monitor", "create", "monitor", "--pgport", str(self.monitor_port))
        self._wait_for_monitor()
        for name, value in FAST_FAILOVER.items():  # ALTER SYSTEM one at a time: not in a transaction
            self.monitor_sql(f"ALTER SYSTEM SET {name} = {value}")
        self.monitor_sql("SELECT pg_reload_conf()")
        monitor = f"postgres://autoctl_node@127.0.0.1:{self.monitor_port}/{MONITOR_DB}?sslmode=disable"
        for node, port in self.ports.items():  # one after the other: the second clones the first
            self._create_and_run(node, "create", "postgres", "--pgport", str(port), "--name", node,
                                 "--dbname", self.database, "--monitor", monitor)
            self.wait_for_states({"node1": "single"} if node == "node1" else
                                 {"node1": "primary", "node2": "secondary"})
        self.sql("node1", "postgres", f"ALTER ROLE {self._role} SET synchronous_commit = on")
        return self

    def stop(self) -> None:
        for name in list(self._processes):
            self._kill(name)
        if os.environ.get("HOOKLINE_KEEP_HA") != "1":  # kept for a look at its logs
            shutil.rmtree(self.root, ignore_errors=True)

    def _create_and_run(self, name: str, *create: str) -> None:
        pgdata = self.root / name
        if name != "node2":  # node2 is cloned from node1, settings included
            self._initdb(pgdata)
        args = [str(self._autoctl), *create, "--pgdata", str(pgdata), "--pgctl", str(self._bin / "pg_ctl"),
                "--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--auth", "trust", "--no-ssl", "--run"]
        self._spawn(name, args)

    def _initdb(self, pgdata: Path) -> None:
        """A cluster whose sockets live in the formation's directory: Debian's default, /var/run/postgresql,
        is not writable by the system user (pg_autoctl has no option for it, so it takes an existing cluster)."""
        sockets = self.root / "sockets"
        sockets.mkdir(exist_ok=True)
        if self._run_as:
            shutil.chown(sockets, self._run_as, self._run_as)
        subprocess.run([str(self._bin / "initdb"), "-D", str(pgdata), "--auth=trust", "--no-sync", "-E", "UTF8"],
                       capture_output=True, check=True, timeout=120, **self._identity())
        with (pgdata / "postgresql.conf").open("a") as conf:
            conf.write(f"unix_socket_directories = '{sockets}'\n")
            # The tests kill processes, never the machine: what was written survives in the page
            # cache, so nothing needs flushing; and the standby's base backup need not wait for a
            # checkpoint spread over minutes (it waited 94 s for one, paced at the default 0.9).
            conf.write("fsync = off\ncheckpoint_completion_target = 0\n")

    def _identity(self) -> dict[str, Any]:
        return {"user": self._run_as, "group": self._run_as, "extra_groups": []} if self._run_as else {}

    def _spawn(self, name: str, args: list[str]) -> None:
        log = (self.root / f"{name}.log").open("ab")
        home = self.root / "home"
        home.mkdir(exist_ok=True)
        if self._run_as:
            shutil.chown(home, self._run_as, self._run_as)
        env = {"PATH": f"{self._bin}:/usr/bin:/bin", "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"),
               "XDG_DATA_HOME": str(home / "data"), "PGHOST": "127.0.0.1"}
        self._processes[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                 cwd=self.root, start_new_session=True, **self._identity())

    def _kill(self, name: str) -> None:
        """SIGKILL the node's whole session (keeper, postmaster, backends) and its postmaster by its pid
        file too, should it have left the session."""
        process = self._processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        pidfile = self.root / name / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
        process.wait(10)

    # -- failover -------------------------------------------------------------------------------

    def states(self) -> dict[str, tuple[str, str]]:
        """Each node's (reported state, goal state), as the monitor sees them."""
        rows = self.monitor_sql("SELECT nodename, reportedstate, goalstate FROM pgautofailover.node")
        return {name: (reported, goal) for name, reported, goal in (line.split("|") for line in rows.splitlines())}

    def primary(self) -> str:
        return next(name for name, (reported, goal) in self.states().items()
                    if reported in ("primary", "wait_primary") and goal == reported)

    def wait_for_states(self, wanted: dict[str, str], timeout: float = 120.0) -> None:
        """Until each named node has reached (reported and goal) the state given."""
        eventually_sync(lambda: all(self.states().get(n) == (s, s) for n, s in wanted.items()),
                        what=f"pg_auto_failover nodes in {wanted} (see {self.root}/*.log)", timeout=timeout)

    def kill_primary(self) -> str:
        """SIGKILL the primary's keeper and postmaster; the name of the node killed."""
        old = self.primary()
        self._kill(old)
        return old

    def wait_for_new_primary(self, old: str, timeout: float = 90.0) -> str:
        """Until the other node accepts writes as the primary (alone: wait_primary); its name."""
        new = next(n for n in self.ports if n != old)
        eventually_sync(lambda: self.states()[new][0] in ("primary", "wait_primary")
                        and self.sql(new, self.database, "SELECT NOT pg_is_in_recovery()") == "t",
                        what=f"{new} promoted (see {self.root}/*.log)", timeout=timeout)
        return new

    def restart_old_node(self, old: str, timeout: float = 120.0) -> None:
        """Run the killed node's keeper again: it rejoins as the new primary's standby."""
        self._spawn(old, [str(self._autoctl), "run", "--pgdata", str(self.root / old)])
        new = next(n for n in self.ports if n != old)
        self.wait_for_states({new: "primary", old: "secondary"}, timeout)

    # -- SQL ------------------------------------------------------------------------------------

    def _wait_for_monitor(self) -> None:
        eventually_sync(lambda: self.monitor_sql("SELECT count(*) FROM pgautofailover.formation") != "",
                        what=f"the pg_auto_failover monitor (see {self.root}/monitor.log)", timeout=60,
                        ignoring=(subprocess.CalledProcessError,))

    def monitor_sql(self, sql: str) -> str:
        return self._psql(self.monitor_port, MONITOR_DB, sql)

    def sql(self, node: str, database: str, sql: str) -> str:
        return self._psql(self.ports[node], database, sql)

    def _psql(self, port: int, database: str, sql: str) -> str:
        result = subprocess.run([str(self._bin / "psql"), "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1",
                                 "-h", "127.0.0.1", "-p", str(port), "-U", self._role, "-d", database, "-c", sql],
                                capture_output=True, text=True, timeout=30, check=True)
        return result.stdout.strip()
