"""HOOKLINE_DATABASE_PASSWORD_FILE (core/settings.py, core/db.py): the password read from a file for
every new connection, so that a short-lived token (RDS IAM, Cloud SQL IAM, Entra ID) rewritten in place
is used from the next connection on, while open connections keep theirs.

On the session's embedded Postgres, which checks every role's password (SCRAM): a role of the test's
own, its password changed (ALTER ROLE) and the file rewritten as a token refresher would."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from hookline.core import db
from hookline.core.settings import PasswordFileError, read_password_file
from support.inbox import apply_provider, create_effect_tables, insert_events, status_counts
from support.postgres import PgServer
from support.processes import TESTS_DIR, worker
from support.waiting import eventually

VARIABLE = "HOOKLINE_DATABASE_PASSWORD_FILE"


@dataclass
class Login:
    """A role that logs in with a password, its URL without one, and the file that holds it."""

    role: str
    url: str  # no password in it
    password_file: Path
    password: str

    def refresh(self, password: str) -> None:
        """Write the file as a token refresher does: a new file renamed over the old one (never a
        half-written file), with the trailing newline `echo` leaves."""
        fresh = self.password_file.with_suffix(".new")
        fresh.write_text(password + "\n")
        fresh.replace(self.password_file)
        self.password = password


@pytest.fixture
async def login(pg_server: PgServer, database_url: str, tmp_path: Path) -> AsyncIterator[Login]:
    if pg_server.embedded is None:
        pytest.skip("needs the embedded server, which checks passwords (HOOKLINE_TEST_DATABASE_URL may not)")
    role, password = f"pw_{uuid.uuid4().hex[:12]}", secrets.token_urlsafe(24)
    admin = await asyncpg.connect(pg_server.admin_url)
    try:
        # A superuser, so that the worker may use the schema as the installing role does; its password
        # is checked all the same (pg_hba: scram-sha-256 for every role).
        await admin.execute(f"CREATE ROLE \"{role}\" LOGIN SUPERUSER PASSWORD '{password}'")
        parts = urlsplit(database_url)
        url = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))
        found = Login(role, url, tmp_path / "db-password", password)
        found.refresh(password)
        yield found
    finally:
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()


async def change_password(admin: asyncpg.Connection, login: Login) -> str:
    """The role's new password, set in Postgres first (as IAM rotates a token) and the file after."""
    new = secrets.token_urlsafe(24)
    await admin.execute(f"ALTER ROLE \"{login.role}\" PASSWORD '{new}'")
    return new


async def test_each_new_connection_reads_the_file_again(database_url: str, login: Login) -> None:
    admin = await asyncpg.connect(database_url)
    first = await db.connect(login.url, password_file=login.password_file)
    pool = await db.create_pool(login.url, password_file=login.password_file, min_size=1, max_size=2)
    try:
        old = login.password
        new = await change_password(admin, login)
        # The file still holds the old password: a new connection is refused, with Postgres's words.
        with pytest.raises(asyncpg.InvalidPasswordError) as refused:
            await db.connect(login.url, password_file=login.password_file)
        assert old not in str(refused.value) and new not in str(refused.value)
        login.refresh(new)
        second = await db.connect(login.url, password_file=login.password_file)
        await second.close()
        # Open connections are untouched, the pool's among them; the pool's next one logs in anew.
        assert await first.fetchval("SELECT current_user") == login.role
        async with pool.acquire() as held, pool.acquire() as grown:
            assert held.get_server_pid() != grown.get_server_pid()
            assert await grown.fetchval("SELECT current_user") == login.role
    finally:
        await pool.close()
        await first.close()
        await admin.close()


async def test_without_a_url_the_environment_names_both(login: Login, monkeypatch: pytest.MonkeyPatch) -> None:
    """db.connect() with no URL: HOOKLINE_DATABASE_URL and its password file (the one-shot commands)."""
    monkeypatch.setenv("HOOKLINE_DATABASE_URL", login.url)
    monkeypatch.setenv(VARIABLE, str(login.password_file))
    conn = await db.connect()
    try:
        assert await conn.fetchval("SELECT current_user") == login.role
    finally:
        await conn.close()


def test_one_trailing_newline_is_stripped_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "password"
    for written, password in [("token\n", "token"), ("token", "token"), ("token\r\n", "token"),
                              ("token\n\n", "token\n"), (" token \n", " token ")]:
        path.write_text(written)
        assert read_password_file(path) == password, repr(written)
    assert "token" not in repr(db.PasswordFile(path))
    # No password: an OSError (retried as a database error is), naming the file and nothing of its content.
    for written, problem in [(b"\n", "is empty"), (b"\xfftoken", "is not UTF-8 text")]:
        path.write_bytes(written)
        with pytest.raises(PasswordFileError, match=f"{VARIABLE}: .*password {problem}$") as caught:
            db.PasswordFile(path)()
        assert isinstance(caught.value, db.DATABASE_ERRORS) and "token" not in str(caught.value)


def status_of(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return int(answer.status)


HANDLER_PROVIDER = """
signature: {scheme: none}
handler: "support.handlers:record_effect_in_its_transaction"
retry: {maxAttempts: 3, initialDelaySeconds: 0, maxDelaySeconds: 0}
"""


async def test_a_worker_keeps_working_across_a_password_change(database_url: str, login: Login,
                                                                 log_dir: Path) -> None:
    """A real `hookline worker` logs in with the file; the password changes and the file is rewritten;
    every connection of the worker is ended, so each one it needs is a new one: the events after that
    are processed too, and none is lost or done twice. The worker polls only every ten minutes, so it
    takes an event only when its LISTEN connection (a dedicated one, not the pool's) hears of it."""
    admin = await asyncpg.connect(database_url)
    await create_effect_tables(admin)
    apply_provider(database_url, "pwfile", HANDLER_PROVIDER)

    async def told_and_counted() -> dict[str, int]:
        # What the receiver's insert sends; the events here are inserted directly.
        await admin.execute("SELECT pg_notify('hookline_inbox', 'pwfile')")
        return await status_counts(admin)

    old = login.password
    service = worker(login.url, log_dir, "--concurrency", "4", "--poll-interval", "600",
                     env={VARIABLE: str(login.password_file)})
    try:
        before = await insert_events(admin, "pwfile", 20)
        await eventually(told_and_counted, equals={"done": 20}, what="the first events done")
        login.refresh(await change_password(admin, login))
        rotated_at = await admin.fetchval("SELECT clock_timestamp()")
        ended = await admin.fetchval(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = $1",
            login.role)
        assert ended >= 2, "the worker's pool and LISTEN connections were not found"
        with pytest.raises(asyncpg.InvalidPasswordError):  # the old password is no longer any good
            await asyncpg.connect(login.url, password=old)

        after = await insert_events(admin, "pwfile", 20)
        await eventually(told_and_counted, equals={"done": 40}, what="the events after the change done")
        effects = [r["event_id"] for r in await admin.fetch("SELECT event_id FROM test_effects")]
        assert sorted(effects) == sorted(before + after)  # each event's effect exactly once
        reconnected = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND backend_start > $2",
            login.role, rotated_at)
        assert reconnected >= 1
        assert await asyncio.to_thread(status_of, service.url + "/readyz") == 200
    finally:
        await admin.close()
        code = service.stop()
    logs = service.logs()
    assert code == 0, logs
    assert old not in logs and login.password not in logs


# --- bad configuration, through the real CLI --------------------------------------------------------

def hookline(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    merged = {**os.environ, "HOOKLINE_LOG_FORMAT": "text", "PYTHONPATH": TESTS_DIR, **env}
    return subprocess.run([sys.executable, "-m", "hookline", *argv], env=merged, capture_output=True, text=True,
                          timeout=60, check=False)


def assert_one_line(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr


COMMANDS = [["worker"], ["receiver"], ["relay"], ["migrate"], ["providers", "list"], ["operator", "-A"]]
# Every case fails before anything connects: no server is needed behind this URL.
NOWHERE = "postgresql://hookline@127.0.0.1:9/hookline"


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
async def test_a_password_file_that_cannot_be_read_is_one_line(tmp_path: Path, argv: list[str]) -> None:
    missing = tmp_path / "no-such-file"
    result = await asyncio.to_thread(hookline, *argv, env={"HOOKLINE_DATABASE_URL": NOWHERE, VARIABLE: str(missing)})
    assert_one_line(result, VARIABLE, str(missing), "No such file or directory")


async def test_an_empty_password_file_or_a_second_password_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    result = await asyncio.to_thread(hookline, "worker", env={"HOOKLINE_DATABASE_URL": NOWHERE, VARIABLE: str(empty)})
    assert_one_line(result, VARIABLE, "is empty")

    token = tmp_path / "token"
    token.write_text("from-the-file\n")
    with_password = NOWHERE.replace("hookline@", "hookline:hunter2@")
    for argv in (["worker"], ["providers", "list"]):
        result = await asyncio.to_thread(hookline, *argv, env={"HOOKLINE_DATABASE_URL": with_password,
                                                                VARIABLE: str(token)})
        assert_one_line(result, VARIABLE, "HOOKLINE_DATABASE_URL has a password", "give the password one way")
        assert "hunter2" not in result.stderr and "from-the-file" not in result.stderr


async def test_a_command_logs_in_with_the_file_and_never_prints_it(database_url: str, login: Login) -> None:
    env = {"HOOKLINE_DATABASE_URL": login.url, VARIABLE: str(login.password_file)}
    listed = await asyncio.to_thread(hookline, "providers", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    # A wrong password: Postgres's refusal, in one line, without the file's content.
    login.password_file.write_text("not-the-password\n")
    refused = await asyncio.to_thread(hookline, "providers", "list", env=env)
    assert_one_line(refused, "password authentication failed")
    assert "not-the-password" not in refused.stderr
