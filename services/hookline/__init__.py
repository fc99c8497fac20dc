"""Hookline: webhook infrastructure on PostgreSQL.

``hookline.core`` is the shared core (storage, signatures, claiming, delivery,
configuration, metrics); ``hookline.receiver``, ``hookline.worker`` and
``hookline.relay`` are the services on top of it; ``hookline.outbox`` is the
producer API for outgoing webhooks.
"""

__version__ = "0.1.0"
