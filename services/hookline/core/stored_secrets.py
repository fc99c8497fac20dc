"""The stored signing secrets as a whole: sealing plaintext in place (the upgrade, run by ``hookline
migrate``) and re-wrapping every value under the key ring's first key (``hookline secrets rotate-key``).

Both run in one transaction that locks the rows it reads; readers keep working throughout, since every
process's key ring opens values wrapped by any of its keys. A rotation checks every value: one that does
not open (its key is gone, or it was altered or moved) is never rewritten, and the run stops with the
reason and changes nothing.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from functools import partial

import asyncpg

from hookline.core import db
from hookline.core import secrets_at_rest as sealing


def _query(name: str) -> str:
    return db.query(name, "secrets.sql")


@dataclass
class ResealReport:
    """How many values were looked at and rewritten, and which keys had wrapped them before."""

    values: int = 0
    sealed: int = 0  # plaintext from before encryption at rest, now sealed
    rewrapped: int = 0  # sealed by another key, now wrapped by the first
    previous_keys: Counter[str] = field(default_factory=Counter)

    def lines(self, ring: sealing.KeyRing) -> list[str]:
        found = ", ".join(f"{k}: {n}" for k, n in sorted(self.previous_keys.items())) or "none"
        return [f"secrets: {self.values} stored values; {self.sealed} plaintext sealed, {self.rewrapped} re-wrapped",
                f"key id {ring.sealing_id} now wraps every value (before this run, values by key id: {found})"]


async def reseal_all(conn: asyncpg.Connection, ring: sealing.KeyRing, *, rewrap: bool) -> ResealReport:
    """Seal every plaintext secret; with ``rewrap``, also wrap every sealed one by the first key."""
    report = ResealReport()

    def converge(value: str, context: str) -> str:
        report.values += 1
        if sealing.is_sealed(value):
            report.previous_keys[value.split(":", 2)[1]] += 1
            if not rewrap:
                return value  # the upgrade seals plaintext only; a sealed value is left as it is
            if not ring.needs_sealing(value):
                ring.open(value, context)  # a value that does not open stops the run
                return value
            report.rewrapped += 1
        else:
            report.sealed += 1
        return ring.reseal(value, context)

    def converge_list(text: str, context: str) -> str:
        entries = json.loads(text)
        return json.dumps([{**e, "value": converge(str(e["value"]), context)} for e in entries])

    def converge_egress(endpoint: str, value: str, field: str) -> str:
        return converge(value, sealing.endpoint_egress_context(endpoint, field))

    async with conn.transaction():
        for row in await conn.fetch(_query("lock_provider_secrets")):
            name = row["name"]
            secrets = converge_list(row["secrets"], sealing.provider_secrets_context(name))
            destination = row["destination_secret"]
            if destination:
                destination = converge(destination, sealing.destination_secret_context(name))
            if json.loads(secrets) != json.loads(row["secrets"]) or destination != row["destination_secret"]:
                await conn.execute(_query("set_provider_secrets"), name, secrets, destination)
        for row in await conn.fetch(_query("lock_endpoint_secrets")):
            name = row["name"]
            secrets = converge_list(row["secrets"], sealing.endpoint_secrets_context(name))
            egress = row["egress"] and json.dumps(sealing.map_egress_secrets(
                json.loads(row["egress"]), partial(converge_egress, name)))
            if json.loads(secrets) != json.loads(row["secrets"]) or (
                    egress and json.loads(egress) != json.loads(row["egress"])):
                await conn.execute(_query("set_endpoint_secrets"), name, secrets, egress)
    return report


async def count_plaintext(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval(_query("count_plaintext_secrets")))


async def seal_plaintext(conn: asyncpg.Connection) -> list[str]:
    """The upgrade step of ``hookline migrate``: with a key ring, seal every plaintext secret in place;
    without one, change nothing and say how many plaintext secrets remain (lines to show)."""
    ring = sealing.configured_ring()
    if ring is None:
        remaining = await count_plaintext(conn)
        if not remaining:
            return []
        return [f"warning: {remaining} signing secrets are stored in plaintext: set {sealing.KEYS_FILE_ENV} "
                "and run `hookline migrate` again to encrypt them at rest"]
    report = await reseal_all(conn, ring, rewrap=False)
    return [f"secrets: {report.sealed} plaintext values encrypted at rest"] if report.sealed else []
