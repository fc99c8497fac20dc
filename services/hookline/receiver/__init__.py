"""The ingest service: verify, store idempotently, answer after commit."""
