"""Hookline verifying Hookline: an inbox handler publishes to the outbox in the same transaction, and the
relay delivers to a second Hookline receiver that checks the Standard Webhooks signature."""

from __future__ import annotations

import base64
import json

import aiohttp
import pytest

from hookline.core.embedded import free_port
from support.inbox import apply_provider, create_effect_tables
from support.postgres import PgServer
from support.processes import ServiceProcess, hookline_cli, receiver, worker
from support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")

PARTNER_SECRET = "whsec_" + base64.b64encode(b"hookline-to-hookline-secret-0001").decode()


async def test_inbox_to_outbox_to_another_hookline(pg_server: PgServer, database_url, pool, log_dir) -> None:
    import asyncpg

    await create_effect_tables(pool)
    partner_db = pg_server.url_for(await pg_server.create_database())
    partner = await asyncpg.connect(partner_db)
    procs: list[ServiceProcess] = []
    try:
        await create_effect_tables(partner)
        # The partner: a Hookline whose provider verifies our relay's signatures.
        apply_provider(partner_db, "upstream", f"""
signature: {{scheme: standard-webhooks, secrets: ["{PARTNER_SECRET}"]}}
eventType: {{jsonPointer: /type}}
handler: "support.handlers:record_effect"
""")
        partner_receiver = receiver(partner_db, log_dir)
        procs += [partner_receiver, worker(partner_db, log_dir)]

        # Us: orders come in, the handler publishes order.shipped in its transaction.
        apply_provider(database_url, "orders", 'signature: {scheme: none}\nhandler: "support.handlers:publish_shipped"')
        added = hookline_cli(database_url, "endpoints", "add", "partner", "--url",
                             f"{partner_receiver.url}/webhooks/upstream", "--event-type", "order.*",
                             "--secret", PARTNER_SECRET, "--ordered")
        assert added.returncode == 0, added.stderr
        ours = receiver(database_url, log_dir)
        procs += [ours, worker(database_url, log_dir)]
        port = free_port()
        procs.append(ServiceProcess(["relay", "--allow-private-networks", "--host", "127.0.0.1", "--port", str(port)],
                                    database_url, log_dir, port=port).start())

        async with aiohttp.ClientSession() as http:
            for i in range(20):
                body = json.dumps({"id": f"ord_{i}", "type": "order.paid"})
                async with http.post(f"{ours.url}/webhooks/orders", data=body) as r:
                    assert r.status == 200
        await eventually(lambda: partner.fetchval("SELECT count(*) FROM test_effects"), equals=20, timeout=60)
    finally:
        for p in procs:
            p.stop()
    outbox_ids = {r["event_id"] for r in await pool.fetch("SELECT event_id FROM hookline.outbox")}
    assert len(outbox_ids) == 20
    received = await partner.fetch("SELECT event_id, event_type FROM hookline.inbox")
    await partner.close()
    # The partner stored each event under its webhook-id: the outbox event id.
    assert {r["event_id"] for r in received} == outbox_ids
    assert {r["event_type"] for r in received} == {"order.shipped"}
    assert await pool.fetchval("SELECT count(*) FROM test_effects") == 20

