"""make bench-relay: outbox events delivered per second, and commit-to-delivery latency.

A producer publishes ``--events`` events with ``hookline.publish`` in transactions of
``--batch`` (optionally throttled to ``--rate`` events/s) while ``hookline relay`` runs as
its own process and delivers them to a fast local aiohttp endpoint. Latency is measured
from the producer's COMMIT returning to the endpoint receiving the event's first
delivery (same machine, same clock). Unthrottled, the producer outruns the relay, so
the latency includes the queue that builds up; use ``--rate`` below the throughput to
see the latency of a relay that keeps up. The endpoint and the producer run on uvloop, as
``hookline relay`` does: on the default loop the endpoint took more of the two cores the
relay and Postgres share.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import uvloop
from aiohttp import web

from benchmarks.common import BenchDatabase, Usage, free_port, percentile, record, start_service
from hookline.core import db
from hookline.relay import endpoints

PUBLISH = "SELECT hookline.publish('invoice.paid', p, 'invoice', NULL, NULL) FROM unnest($1::text[]::jsonb[]) AS p"


class Sink:
    """The endpoint: answers 204 at once and notes when each webhook-id first arrived."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.requests = 0
        self.all_arrived = asyncio.Event()
        self.expected = 0

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.requests += 1
        self.arrived.setdefault(request.headers["webhook-id"], time.time())
        if len(self.arrived) >= self.expected:
            self.all_arrived.set()
        return web.Response(status=204)


async def produce(url: str, count: int, batch: int, rate: float | None) -> dict[str, float]:
    committed: dict[str, float] = {}
    conn = await db.connect(url)
    started = time.monotonic()
    try:
        for start in range(0, count, batch):
            payloads = [json.dumps({"id": f"inv_{n}", "amount": 4200, "currency": "eur", "customer": "cus_123"})
                        for n in range(start, min(count, start + batch))]
            async with conn.transaction():
                ids = [r[0] for r in await conn.fetch(PUBLISH, payloads)]
            now = time.time()
            committed.update(dict.fromkeys(ids, now))
            if rate:
                ahead = (start + batch) / rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
    finally:
        await conn.close()
    return committed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--quick", action="store_true", help="20,000 events (for make bench)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--batch", type=int, default=100, help="events per producer transaction")
    parser.add_argument("--rate", type=float, default=None, help="producer events/s (default: as fast as it can)")
    parser.add_argument("--relay-args", default="", help="extra flags for `hookline relay`")
    parser.add_argument("--results", default=None, help="append the figures as JSON lines (for make bench)")
    args = parser.parse_args()
    if args.quick:
        args.events = min(args.events, 20_000)

    database = BenchDatabase()
    url = await database.start()
    sink = Sink()
    sink.expected = args.events
    app = web.Application()
    app.router.add_post("/hook", sink.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    try:
        conn = await db.connect(url)
        await endpoints.add(conn, "bench", f"http://127.0.0.1:{port}/hook", max_attempts=100, initial_delay=0.1,
                            max_delay=1.0)
        await conn.close()
        relay_port = free_port()
        proc = start_service(["relay", "--allow-private-networks", "--host", "127.0.0.1", "--port", str(relay_port),
                              "--concurrency", str(args.concurrency), *args.relay_args.split()], url, relay_port)
        usage = Usage([proc.pid])
        try:
            usage.start()
            started = time.time()
            committed = await produce(url, args.events, args.batch, args.rate)
            produced = time.time()
            await asyncio.wait_for(sink.all_arrived.wait(), timeout=600)
            await usage.stop()
            relay_cpu = usage.cpu
        finally:
            proc.terminate()
            proc.wait(30)
        last = max(sink.arrived.values())
        latencies = [sink.arrived[i] - committed[i] for i in committed]
        elapsed = last - started
        print(f"relay: {args.events:,} events delivered in {elapsed:.1f} s = {args.events / elapsed:,.0f} "
              f"deliveries/s at concurrency {args.concurrency} ({sink.requests - args.events} extra requests)")
        print(f"producer: {args.events / (produced - started):,.0f} events/s committed "
              f"({'unthrottled' if not args.rate else f'throttled to {args.rate:,.0f}/s'}, "
              f"{args.batch} per transaction)")
        print(f"relay process CPU: {relay_cpu:.1f} s = {relay_cpu / args.events * 1e6:,.0f} us per delivery "
              f"(target <= 160 us; a ceiling of {args.events / relay_cpu:,.0f} deliveries/s per core when nothing "
              f"else competes); RSS under load {usage.describe_rss()} (target <= 100 MB)")
        record(args.results, "relay", "relay CPU per delivery", relay_cpu / args.events * 1e6, "<= 160", "us")
        record(args.results, "relay", "relay RSS", usage.max_rss, "<= 100", "MB")
        print(f"commit-to-delivery latency: p50 {percentile(latencies, 50) * 1000:.1f} ms, "
              f"p99 {percentile(latencies, 99) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms")
    finally:
        await runner.cleanup()
        database.stop()


if __name__ == "__main__":
    uvloop.run(main())
