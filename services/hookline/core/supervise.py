"""Run N copies of a service process on one port (SO_REUSEPORT), for hosts with several cores.

Python serves HTTP on one core per process. On Kubernetes you scale pods instead;
on a VM, ``--processes N`` starts N children sharing the listening port, forwards
SIGTERM/SIGINT to them, and exits when any child exits (so a supervisor such as
systemd restarts the whole group rather than running it half-strength).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from hookline.core.settings import REUSE_PORT


def run_children(argv: list[str], count: int) -> int:
    env = {**os.environ, REUSE_PORT: "1"}  # read by each child's settings (core/settings.py)
    children = [subprocess.Popen([sys.executable, "-m", "hookline", *argv], env=env) for _ in range(count)]

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while all(child.poll() is None for child in children):
        time.sleep(0.2)
    forward(signal.SIGTERM, None)
    codes = [child.wait() for child in children]
    return next((code for code in codes if code != 0), 0)
