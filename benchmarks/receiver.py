"""make bench-receiver: receiver throughput vs. the pgbench ceiling of single-row inserts.

The load generator speaks HTTP/1.1 keep-alive over raw asyncio streams with
pre-built, pre-signed requests, so the client costs little CPU next to the
receiver it measures. Both runs use the same Postgres, table and concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
import uuid

from benchmarks.common import BenchDatabase, free_port, percentile, pgbench, start_service
from hookline.core.signatures import sign_standard_webhooks

SECRET = "whsec_" + base64.b64encode(b"benchmark-secret-benchmark-secret").decode()
PROVIDER = f"""
kind: WebhookProvider
metadata: {{name: bench}}
spec:
  signature: {{scheme: standard-webhooks, secrets: ["{SECRET}"]}}
  handler: "hookline.examples.handlers:log_event"
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


async def drive(port: int, requests: list[bytes], connections: int, seconds: float) -> tuple[int, list[float], int]:
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
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(connections)))
    return len(latencies), latencies, errors


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--events", type=int, default=200_000, help="pre-signed events prepared")
    parser.add_argument("--processes", type=int, default=2,
                        help="receiver processes sharing the port (default 2: one per core here)")
    parser.add_argument("--receiver-args", default="", help="extra flags for `hookline receiver`")
    args = parser.parse_args()

    database = BenchDatabase()
    url = await database.start()
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
        try:
            requests = build_requests(args.events, port)
            await drive(port, requests[:2000], args.connections, 2)  # warm-up
            count, latencies, errors = await drive(port, requests[2000:], args.connections, args.seconds)
        finally:
            proc.terminate()
            proc.wait(10)
        rate = count / args.seconds
        body_hex = requests[0].split(b"\r\n\r\n", 1)[1].hex()
        script = (
            "INSERT INTO hookline.inbox (provider, event_id, event_type, headers, body, content_type) "
            "VALUES ('ceiling', md5(random()::text || clock_timestamp()::text), 'invoice.paid', "
            f"'{{\"content-type\": \"application/json\"}}', '\\x{body_hex}', 'application/json') "
            "ON CONFLICT (provider, event_id) DO NOTHING;\n"
        )
        ceiling = await asyncio.to_thread(pgbench, url, script, clients=args.connections, seconds=args.seconds)
        print(f"receiver ({args.processes} process(es)): {rate:,.0f} accepted/s over {args.seconds}s at "
              f"{args.connections} connections "
              f"({errors} non-200), latency p50 {percentile(latencies, 50) * 1000:.1f} ms, "
              f"p99 {percentile(latencies, 99) * 1000:.1f} ms")
        print(f"ceiling:  {ceiling:,.0f} single-row INSERT ... ON CONFLICT DO NOTHING tx/s (pgbench, "
              f"{args.connections} clients, same Postgres and table)")
        print(f"ratio receiver/ceiling: {rate / ceiling:.2f}")
    finally:
        database.stop()


if __name__ == "__main__":
    asyncio.run(main())
