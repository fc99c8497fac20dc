"""make bench-receiver: receiver throughput vs. the pgbench ceiling of single-row inserts.

Load comes from wrk (a C load generator; `apt-get install wrk`) when it is on PATH:
every request is a distinct, pre-signed Standard Webhooks event (a Lua script hands
them out, a disjoint slice per wrk thread), so each 200 is a new row, never a
duplicate. Without wrk the Python generator below is used, with a warning: it
takes a core from the receiver and Postgres on a small machine, and then measures
itself as much as the receiver.

The receiver and the ceiling (pgbench inserting the same row shape into the same
table at the same concurrency) alternate, ``--rounds`` times each, with a
CHECKPOINT before every phase, so a checkpoint cannot land in one side only. The
RSS of each receiver process under load and its CPU per accepted event are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import BenchDatabase, Usage, checkpoint, free_port, percentile, pgbench, record, start_service
from hookline.core.signatures import sign_standard_webhooks

SECRET = "whsec_" + base64.b64encode(b"benchmark-secret-benchmark-secret").decode()
PROVIDER = f"""
kind: WebhookProvider
metadata: {{name: bench}}
spec:
  signature: {{scheme: standard-webhooks, secrets: ["{SECRET}"]}}
  handler: "hookline.examples.handlers:log_event"
"""
# Hands each wrk thread its own file of pre-built requests (separated by NUL bytes), one per request.
WRK_SCRIPT = """
local counter = 0
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end
function init(args)
  local f = assert(io.open(args[1] .. "-" .. id .. ".bin", "rb"))
  local data = f:read("*a")
  f:close()
  requests = {}
  for r in string.gmatch(data, "([^%z]+)") do requests[#requests + 1] = r end
  n = 0
end
function request()
  n = n + 1
  return requests[(n - 1) % #requests + 1]
end
"""


def build_requests(count: int, port: int) -> list[bytes]:
    now = int(time.time())
    requests = []
    for _ in range(count):
        event_id = f"msg_{uuid.uuid4().hex}"
        body = json.dumps({"type": "invoice.paid", "data": {"id": event_id, "amount": 4200,
                           "currency": "eur", "customer": "cus_123456789"}}).encode()
        headers = sign_standard_webhooks([SECRET], event_id, now, body)
        head = (f"POST /webhooks/bench HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n")
        requests.append(head.encode() + body)
    return requests


@dataclass(frozen=True)
class Load:
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float


async def drive_python(port: int, requests: list[bytes], connections: int, seconds: float) -> Load:
    """The fallback load generator: HTTP/1.1 keep-alive over raw asyncio streams."""
    queue = iter(requests)
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds

    async def connection() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.monotonic() < deadline:
                request = next(queue, None)
                if request is None:
                    return
                started = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                latencies.append(time.perf_counter() - started)
                if not head.startswith(b"HTTP/1.1 200"):
                    errors += 1
                if b"\r\nconnection: close" in head.lower():  # as a sender's HTTP client: a new connection
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(connections)))
    return Load(len(latencies), errors, seconds, percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000)


def _milliseconds(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if not match:
        return float("nan")
    return float(match.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[match.group(2)]


async def drive_wrk(port: int, requests: list[bytes], connections: int, seconds: float, work: Path,
                    threads: int = 2) -> Load:
    """wrk over ``requests`` (each sent at most once while they last)."""
    prefix = work / f"requests-{uuid.uuid4().hex[:6]}"
    share = -(-len(requests) // threads)
    for t in range(threads):
        prefix.with_name(f"{prefix.name}-{t}.bin").write_bytes(b"\0".join(requests[t * share:(t + 1) * share]))
    script = work / "requests.lua"
    script.write_text(WRK_SCRIPT)
    done = await asyncio.to_thread(
        subprocess.run, ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds:g}s", "--latency",
                         "-s", str(script), f"http://127.0.0.1:{port}/webhooks/bench", "--", str(prefix)],
        capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed:\n{done.stdout}\n{done.stderr}")
    out = done.stdout
    total = re.search(r"(\d+) requests in ([\d.]+)(m?s)", out)
    if not total:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    elapsed = float(total.group(2)) * (60 if total.group(3) == "m" else 1)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    # The distribution's own lines: "+/- Stdev" percentages such as 78.99% elsewhere end in "99%" too.
    p50 = re.search(r"^\s*50%\s+(\S+)", out, re.MULTILINE)
    p99 = re.search(r"^\s*99%\s+(\S+)", out, re.MULTILINE)
    return Load(int(total.group(1)), int(non_2xx.group(1)) if non_2xx else 0, elapsed,
                _milliseconds(p50.group(1)) if p50 else float("nan"),
                _milliseconds(p99.group(1)) if p99 else float("nan"))


def ceiling_script(body: bytes) -> str:
    # The receiver's work per event: claim the dedup key, store the event (migration 0011).
    return ("WITH k AS (INSERT INTO hookline.inbox_keys (provider, event_id) "
            "VALUES ('ceiling', md5(random()::text || clock_timestamp()::text)) "
            "ON CONFLICT DO NOTHING RETURNING provider, event_id) "
            "INSERT INTO hookline.inbox (provider, event_id, event_type, headers, body, content_type) "
            "SELECT provider, event_id, 'invoice.paid', "
            f"'{{\"content-type\": \"application/json\"}}', '\\x{body.hex()}', 'application/json' FROM k;\n")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10, help="length of each phase (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="receiver/ceiling phase pairs, alternating (default 3)")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 10 s (for make bench)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--processes", type=int, default=2,
                        help="receiver processes sharing the port (default 2: one per core here)")
    parser.add_argument("--receiver-args", default="", help="extra flags for `hookline receiver`")
    parser.add_argument("--python-load", action="store_true", help="use the Python load generator even if wrk exists")
    parser.add_argument("--results", default=None, help="append the figures as JSON lines (for make bench)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = min(args.rounds, 2), min(args.seconds, 10)
    wrk = None if args.python_load else shutil.which("wrk")
    if wrk:
        print(f"load generator: wrk ({wrk}), {args.connections} connections", file=sys.stderr)
    else:
        print("WARNING: wrk not found (apt-get install wrk); using the Python load generator, which competes "
              "with the receiver and Postgres for CPU: the ratio below understates the receiver", file=sys.stderr)

    database = BenchDatabase()
    url = await database.start()
    work = Path(tempfile.mkdtemp(prefix="bench-receiver-", dir=database.tmp.name))
    try:
        from hookline.core import db
        from hookline.core.providers import apply_providers

        conn = await db.connect(url)
        await apply_providers(conn, PROVIDER)
        await conn.close()
        port = free_port()
        receiver_args = ["receiver", "--host", "127.0.0.1", "--port", str(port), "--processes",
                         str(args.processes), *args.receiver_args.split()]
        proc = start_service(receiver_args, url, port)
        # Distinct events for 12,000/s per phase (above that, wrk would repeat them as duplicates).
        per_round = int(12_000 * args.seconds)
        requests = build_requests(2000 + per_round * args.rounds, port)
        loads: list[Load] = []
        ceilings: list[float] = []
        usage = Usage([proc.pid])
        try:
            await drive_python(port, requests[:2000], args.connections, 2)  # warm-up: connections, statements
            for n in range(args.rounds):
                batch = requests[2000 + n * per_round:2000 + (n + 1) * per_round]
                await checkpoint(url)
                usage.start()
                load = (await drive_wrk(port, batch, args.connections, args.seconds, work) if wrk
                        else await drive_python(port, batch, args.connections, args.seconds))
                await usage.stop()
                loads.append(load)
                await checkpoint(url)
                ceilings.append(await asyncio.to_thread(pgbench, url, ceiling_script(batch[0].split(b"\r\n\r\n")[1]),
                                                        clients=args.connections, seconds=int(args.seconds)))
                print(f"round {n + 1}: receiver {load.requests / load.seconds:,.0f}/s, ceiling {ceilings[-1]:,.0f}/s",
                      file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(10)
        accepted = sum(load.requests - load.errors for load in loads)
        rate = accepted / sum(load.seconds for load in loads)
        ceiling = sum(ceilings) / len(ceilings)
        ratios = [(load.requests - load.errors) / load.seconds / c for load, c in zip(loads, ceilings, strict=True)]
        generator = "wrk" if wrk else "Python (WARNING: competes for CPU)"
        print(f"load generator: {generator}; {args.rounds} alternating rounds of {args.seconds:g} s, "
              f"CHECKPOINT before each phase")
        print(f"receiver ({args.processes} process(es)): {rate:,.0f} accepted/s at {args.connections} connections "
              f"({sum(load.errors for load in loads)} non-200), latency p50 "
              f"{percentile([load.p50_ms for load in loads], 50):.1f} ms, p99 "
              f"{max(load.p99_ms for load in loads):.1f} ms; rounds: "
              + ", ".join(f"{(load.requests - load.errors) / load.seconds:,.0f}" for load in loads))
        print(f"ceiling:  {ceiling:,.0f} single-row INSERT ... ON CONFLICT DO NOTHING tx/s (pgbench, "
              f"{args.connections} clients, same Postgres and table); rounds: "
              + ", ".join(f"{c:,.0f}" for c in ceilings))
        print(f"ratio receiver/ceiling: {rate / ceiling:.2f} (rounds: {', '.join(f'{r:.2f}' for r in ratios)}; "
              f"target >= {1.0 if args.processes >= 2 else 0.8})")
        cpu_us = usage.cpu / max(accepted, 1) * 1e6
        print(f"receiver RSS under load (per process): {usage.describe_rss()} (target <= 80 MB); "
              f"CPU {cpu_us:,.0f} us per accepted event (all receiver processes)")
        target = ">= 1.0" if args.processes >= 2 else ">= 0.8"
        record(args.results, "receiver", f"receiver/ceiling, {args.processes} processes, {generator.split()[0]}",
               rate / ceiling, target)
        record(args.results, "receiver", "receiver RSS (largest process)", usage.max_rss, "<= 80", "MB")
        record(args.results, "receiver", "receiver CPU per event", cpu_us, "", "us")
    finally:
        database.stop()


if __name__ == "__main__":
    asyncio.run(main())
