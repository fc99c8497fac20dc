"""The outbox relay: delivers outgoing webhooks signed per Standard Webhooks."""
