"""Handlers the worker benchmark points its providers at (imported by `hookline worker`)."""

from __future__ import annotations

import os
import time
from typing import TextIO

import asyncpg

from hookline.worker.event import Event

_latency_file: TextIO | None = None


def _probe_file() -> TextIO:
    """Opened once per worker process, in the directory the benchmark hands down."""
    global _latency_file
    if _latency_file is None:
        directory = os.environ["HOOKLINE_BENCH_LATENCY_DIR"]
        _latency_file = open(os.path.join(directory, f"{os.getpid()}.txt"), "a", buffering=1)  # noqa: SIM115
    return _latency_file


async def noop(event: Event) -> None:
    """One parameter: runs outside a transaction, completions are batched."""


async def noop_tx(event: Event, conn: asyncpg.Connection) -> None:
    """Two parameters: runs inside the per-event transaction that also marks the event done."""


async def record_start(event: Event) -> None:
    """Latency probe for the batched path: "<event id> <time.time()>" per line, one file per process.

    A file rather than a table, because a one-parameter handler has no connection, and
    an extra INSERT would itself add latency. Line-buffered appends are cheap enough to
    do on the event loop at benchmark rates.
    """
    started = time.time()
    _probe_file().write(f"{event.event_id} {started}\n")


async def record_start_tx(event: Event, conn: asyncpg.Connection) -> None:
    """Latency probe for the transactional path: the start time, written in the event's own transaction."""
    await conn.execute("INSERT INTO public.bench_latency (event_id, started_at) VALUES ($1, $2)",
                       event.event_id, time.time())


async def effect_tx(event: Event, conn: asyncpg.Connection) -> None:
    """The exactly-once effect: one row, written in the transaction that marks the event done
    (the same row the peers' jobs write through a pool)."""
    await conn.execute("INSERT INTO public.bench_effects (event_id) VALUES ($1)", event.event_id)
