"""core/settings.py: each service's settings from its flags and the environment, read once."""

from __future__ import annotations

from pathlib import Path

import pytest

from hookline.cli import build_parser
from hookline.core.config import ConfigError
from hookline.core.settings import Settings

URL = "postgresql://hookline@db/hookline"


def settings(*argv: str, **environ: str) -> Settings:
    return Settings.for_command(build_parser().parse_args(list(argv)), {"HOOKLINE_DATABASE_URL": URL, **environ})


def test_a_receiver_limit_is_its_flag_else_its_variable_else_the_default() -> None:
    assert settings("receiver").receiver.header_timeout == 10.0
    assert settings("receiver", HOOKLINE_HEADER_TIMEOUT="3.5").receiver.header_timeout == 3.5
    assert settings("receiver", "--header-timeout", "2", HOOKLINE_HEADER_TIMEOUT="3.5").receiver.header_timeout == 2
    assert settings("receiver", HOOKLINE_MAX_QUEUED_EVENTS="12").receiver.max_queued_events == 12
    assert settings("receiver", HOOKLINE_REUSE_PORT="1").receiver.reuse_port


def test_the_relay_reads_its_flags_and_variables() -> None:
    relay = settings("relay", "--concurrency", "8", "--retention-hours", "5", HOOKLINE_ALLOW_PRIVATE_NETWORKS="true",
                     HOOKLINE_ENDPOINT_RETENTION_DEAD_DAYS="3")
    assert (relay.relay.concurrency, relay.relay.allow_private_networks) == (8, True)
    assert (relay.retention.endpoint_done_hours, relay.retention.endpoint_dead_days) == (5, 3)
    assert relay.ops is not None and (relay.ops.host, relay.ops.port) == ("0.0.0.0", 8082)
    with pytest.raises(ConfigError, match="--breaker-failure-rate"):
        settings("relay", "--breaker-failure-rate", "2")


def test_retention_is_read_only_where_a_partition_manager_may_run() -> None:
    """A worker that does not sweep runs no partition manager: a retention variable is none of its business."""
    assert settings("worker", HOOKLINE_RETENTION_DONE_HOURS="soon").worker.concurrency == 16
    with pytest.raises(ConfigError, match="HOOKLINE_RETENTION_DONE_HOURS"):
        settings("worker", "--sweep", HOOKLINE_RETENTION_DONE_HOURS="soon")
    assert settings("worker", "--sweep", HOOKLINE_RETENTION_DONE_HOURS="100").retention.done_hours == 100


def test_the_worker_reads_its_destination_secret_file() -> None:
    worker = settings("worker", "--provider", "a", HOOKLINE_DESTINATION_SECRET_FILE="/run/secret").worker
    assert (worker.providers, worker.destination_secret_file) == (("a",), Path("/run/secret"))


def test_dev_reads_no_database_url() -> None:
    args = build_parser().parse_args(["dev"])
    assert Settings.for_command(args, {}).database_url == ""
    with pytest.raises(ConfigError, match="HOOKLINE_DATABASE_URL is not set"):
        Settings.for_command(build_parser().parse_args(["worker"]), {})


def test_the_services_carry_the_database_password_file(tmp_path: Path) -> None:
    """HOOKLINE_DATABASE_PASSWORD_FILE: checked at start-up (readable, not empty, the URL without a
    password), then carried beside the URL; its content is in no error. `hookline dev` reads none."""
    path = tmp_path / "password"
    path.write_text("s3cret-token\n")
    for command in ("receiver", "worker", "relay"):
        assert settings(command, HOOKLINE_DATABASE_PASSWORD_FILE=str(path)).database_password_file == path
    assert settings("worker").database_password_file is None
    args = build_parser().parse_args(["dev"])
    assert Settings.for_command(args, {"HOOKLINE_DATABASE_PASSWORD_FILE": str(path)}).database_password_file is None
    bad = {str(tmp_path / "absent"): "HOOKLINE_DATABASE_PASSWORD_FILE: cannot read .*absent: No such file",
           str(tmp_path): "HOOKLINE_DATABASE_PASSWORD_FILE: cannot read .*: Is a directory"}
    (tmp_path / "empty").write_text("\n")
    bad[str(tmp_path / "empty")] = "HOOKLINE_DATABASE_PASSWORD_FILE: .*empty is empty"
    for configured, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            settings("worker", HOOKLINE_DATABASE_PASSWORD_FILE=configured)
    for url in ("postgresql://hookline:hunter2@db/hookline", "postgresql://hookline@db/hookline?password=hunter2"):
        with pytest.raises(ConfigError, match="HOOKLINE_DATABASE_URL has a password and "
                                              "HOOKLINE_DATABASE_PASSWORD_FILE is set") as refused:
            settings("worker", HOOKLINE_DATABASE_URL=url, HOOKLINE_DATABASE_PASSWORD_FILE=str(path))
        assert "hunter2" not in str(refused.value)


SESSION_URL = "postgresql://hookline@db-direct/hookline"


def test_the_session_url_is_where_sessions_open_and_defaults_to_the_database_url() -> None:
    for command in ("receiver", "worker", "relay"):
        assert settings(command).session_url == URL
        given = settings(command, HOOKLINE_DATABASE_SESSION_URL=SESSION_URL)
        assert (given.database_url, given.session_url, given.transaction_pooling) == (URL, SESSION_URL, False)
    with pytest.raises(ConfigError, match=r"^HOOKLINE_DATABASE_SESSION_URL must be a postgresql:// URL$"):
        settings("receiver", HOOKLINE_DATABASE_SESSION_URL="mysql://db")


def test_transaction_pooling_needs_the_session_url() -> None:
    with pytest.raises(ConfigError) as refused:
        settings("relay", HOOKLINE_DATABASE_POOLING="transaction")
    assert str(refused.value) == (
        "HOOKLINE_DATABASE_POOLING=transaction: set HOOKLINE_DATABASE_SESSION_URL to a direct (or session-mode) "
        "Postgres URL for LISTEN, leader election and migrations")
    pooled = settings("relay", HOOKLINE_DATABASE_POOLING="Transaction", HOOKLINE_DATABASE_SESSION_URL=SESSION_URL)
    assert pooled.transaction_pooling
    assert not settings("relay", HOOKLINE_DATABASE_POOLING="session").transaction_pooling
    with pytest.raises(ConfigError, match="HOOKLINE_DATABASE_POOLING must be one of session, transaction"):
        settings("relay", HOOKLINE_DATABASE_POOLING="statement")


def test_the_password_file_applies_to_a_session_url_without_a_password(tmp_path: Path) -> None:
    path = tmp_path / "password"
    path.write_text("token\n")
    without = settings("worker", HOOKLINE_DATABASE_PASSWORD_FILE=str(path), HOOKLINE_DATABASE_SESSION_URL=SESSION_URL)
    assert without.session_password_file == path
    own = settings("worker", HOOKLINE_DATABASE_PASSWORD_FILE=str(path),
                   HOOKLINE_DATABASE_SESSION_URL="postgresql://hookline:direct-secret@db-direct/hookline")
    assert (own.database_password_file, own.session_password_file) == (path, None)
