"""How many Postgres connections each Hookline process may hold: one source for the services that size
their pools, the operator's connection budget, and the chart's arithmetic (tests/chart checks it)."""

from __future__ import annotations

# Each process's dedicated connections (core/dedicated.py), outside its pool but inside the totals
# below: the one LISTEN connection, and one per maintenance scope it takes part in the election of
# (core/maintenance.py: a worker "inbox", and "partitions" with --sweep; a relay "outbox" and "partitions").
LISTEN, LEADER_LOCK = 1, 1
# Connections beyond the receiver's batch writers: the provider registry's LISTEN and /readyz.
RECEIVER_EXTRA = 2
# The relay's pool: its claim/complete loops and maintenance need few more than 16 however many
# deliveries are in flight (those wait on HTTP, not on Postgres).
RELAY_CAP, RELAY_EXTRA = 16, 4
# Beyond the worker's concurrency (one connection per transactional handler): the claim loop's and the
# completer's, each kept while it works back to back (core/consumer.py HeldConnection), one for the
# heartbeat, stats and the registry, and the LISTEN and leader lock connections. With every handler in a
# transaction, the heartbeat must still get one, or long handlers lose their leases.
WORKER_EXTRA = 5
OPERATOR = 5  # its pool and, outside it, the maintenance leader's lock
CONSOLE = 6  # `hookline console`: its pool (short reads bounded by the statement timeout) and its LISTEN


def pool_size(total: int, *, locks: int = 0) -> int:
    """The pool's share of a process's ``total``: what its LISTEN and its ``locks`` leader-lock
    connections leave. Every Host (core/host.py) sizes its pool here."""
    return total - LISTEN - locks * LEADER_LOCK


def receiver(db_connections: int) -> int:
    return db_connections + RECEIVER_EXTRA


def relay(concurrency: int) -> int:
    return min(concurrency, RELAY_CAP) + RELAY_EXTRA


def worker(concurrency: int) -> int:
    return concurrency + WORKER_EXTRA
