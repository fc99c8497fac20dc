"""make bench: the four benchmarks in their short mode, and one table of every ratio and its target.

Each benchmark appends its figures to one results file (``--results``); this module runs them one
after the other (never at the same time: they share the machine's cores) and prints the table,
with the date and the machine, ready for docs/performance.md's table.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Each benchmark in its short mode. A benchmark joins the table by taking ``--results FILE`` and appending
# its figures with ``benchmarks.common.record``; its row goes here.
RUNS = [
    ["benchmarks.receiver", "--quick"],
    ["benchmarks.worker", "--quick"],
    ["benchmarks.relay", "--quick"],
    ["benchmarks.storage", "--quick"],
]


def machine() -> str:
    cpus = os.cpu_count() or 0
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")
    return f"{cpus} cores ({model}), Linux {platform.release()}, Python {platform.python_version()}"


def met(value: float, target: str) -> str:
    if not target:
        return ""
    op, _, bound = target.partition(" ")
    limit = float(bound)
    ok = {">=": value >= limit, "<=": value <= limit, ">": value > limit, "<": value < limit}[op]
    return "yes" if ok else "NO"


def main() -> None:
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        results = Path(f.name)
    load = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    failed = []
    for run in RUNS:
        print(f"$ python -m {' '.join(run)}", flush=True)
        done = subprocess.run([sys.executable, "-m", *run, "--results", str(results)], cwd=REPO)
        if done.returncode != 0:
            failed.append(run[0])
            print(f"{run[0]} failed (exit {done.returncode}); its figures are missing below", flush=True)
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    results.unlink()
    print()
    # The machine may be shared: a high load average says the figures below understate Hookline.
    print(f"make bench, {started}, {machine()}; load average {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end")
    print()
    print("| benchmark | figure | measured | target | met |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        unit = f" {row['unit']}" if row["unit"] else ""
        value = f"{row['value']:,.0f}{unit}" if row["unit"] else f"{row['value']:.2f}"
        target = f"{row['target']}{unit}" if row["target"] else "—"
        print(f"| {row['benchmark']} | {row['name']} | {value} | {target} | {met(row['value'], row['target'])} |")
    if failed:  # the others' figures are printed, but a benchmark that broke must not pass for a run
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
