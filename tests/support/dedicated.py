"""A dedicated connection whose (re)opening a test can hold back, as if Postgres were out of reach."""

from __future__ import annotations

import asyncio

import asyncpg

from hookline.core.dedicated import DedicatedConnection


class GatedConnection(DedicatedConnection):
    """Opens only while ``gate`` is set; ``opened`` counts the connections made."""

    def __init__(self, url: str, probe_interval: float = 0.2) -> None:
        super().__init__(url, probe_interval=probe_interval)
        self.gate = asyncio.Event()
        self.gate.set()
        self.opened = 0
        self.last: asyncpg.Connection | None = None  # the connection opened last

    async def open(self) -> asyncpg.Connection:
        await self.gate.wait()
        conn = await super().open()
        self.opened += 1
        self.last = conn
        return conn
