"""Log format: readable lines on a terminal and for `hookline dev`, JSON lines for services
(stderr not a terminal), HOOKLINE_LOG_FORMAT deciding when set. Real processes, a real pty."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import pytest

LOG_ONE_LINE = """
import sys
from hookline.core import logs
from hookline.core.settings import LogSettings
import logging
logs.setup(LogSettings.read(None, for_people=sys.argv[1] == "dev", terminal=sys.stderr.isatty()))
logging.getLogger("hookline.test").warning("event dead", extra={"provider": "stripe", "error": "HTTP 500"})
"""


def log_line(*, tty: bool, command: str = "worker", log_format: str | None = None) -> str:
    """The one line a process logs, with its stderr a terminal (a pty) or a pipe."""
    env = {k: v for k, v in os.environ.items() if k != "HOOKLINE_LOG_FORMAT"}
    if log_format is not None:
        env["HOOKLINE_LOG_FORMAT"] = log_format
    if not tty:
        done = subprocess.run([sys.executable, "-c", LOG_ONE_LINE, command], env=env, capture_output=True,
                              text=True, timeout=30, check=True)
        return done.stderr.strip()
    parent, child = pty.openpty()
    try:
        subprocess.run([sys.executable, "-c", LOG_ONE_LINE, command], env=env, stderr=child, timeout=30, check=True)
        os.close(child)
        child = -1
        chunks = []
        while True:
            try:
                chunk = os.read(parent, 4096)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode().strip()
    finally:
        os.close(parent)
        if child >= 0:
            os.close(child)


def test_services_log_json_when_stderr_is_not_a_terminal() -> None:
    entry = json.loads(log_line(tty=False))
    assert (entry["level"], entry["logger"], entry["msg"]) == ("warning", "hookline.test", "event dead")
    assert (entry["provider"], entry["error"]) == ("stripe", "HTTP 500")


def test_a_terminal_gets_readable_lines() -> None:
    line = log_line(tty=True)
    assert not line.startswith("{")
    assert line.endswith('WARNING hookline.test: event dead provider=stripe error="HTTP 500"'), line


def test_dev_is_readable_even_through_a_pipe() -> None:
    assert log_line(tty=False, command="dev").endswith("event dead provider=stripe error=\"HTTP 500\"")


@pytest.mark.parametrize("tty", [True, False])
def test_the_environment_variable_decides_when_set(tty: bool) -> None:
    assert json.loads(log_line(tty=tty, command="dev", log_format="json"))["msg"] == "event dead"
    assert "WARNING hookline.test: event dead" in log_line(tty=tty, log_format="TEXT")


def test_an_unknown_format_is_refused() -> None:
    env = {**os.environ, "HOOKLINE_LOG_FORMAT": "yaml"}
    done = subprocess.run([sys.executable, "-c", LOG_ONE_LINE, "worker"], env=env, capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode != 0
    assert "HOOKLINE_LOG_FORMAT must be json or text, not 'yaml'" in done.stderr
