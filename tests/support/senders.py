"""How each partner signs its webhooks, written from the sender's side.

Standard Webhooks and Stripe use the senders' own libraries; GitHub, Shopify and
Slack publish no Python signer, so their documented algorithms are written out
here independently of Hookline's verifier.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from datetime import UTC, datetime

import standardwebhooks
import stripe

SW_SECRET = "whsec_" + base64.b64encode(b"standard-webhooks-test-secret-32").decode()
SW_SECRET_2 = "whsec_" + base64.b64encode(b"standard-webhooks-rotated-secret").decode()
STRIPE_SECRET = "whsec_stripe_test_secret_value"
GITHUB_SECRET = "github-test-secret"
SHOPIFY_SECRET = "shopify-test-secret"
SLACK_SECRET = "slack-test-secret"
HMAC_SECRET = "generic-test-secret"


def standard_webhooks(body: bytes, msg_id: str, secret: str = SW_SECRET, ts: float | None = None) -> dict[str, str]:
    when = datetime.fromtimestamp(ts if ts is not None else time.time(), UTC)
    signature = standardwebhooks.Webhook(secret).sign(msg_id, when, body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(when.timestamp())), "webhook-signature": signature}


def stripe_sig(body: bytes, secret: str = STRIPE_SECRET, ts: int | None = None) -> dict[str, str]:
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), secret, timestamp=ts)
    return {"Stripe-Signature": header}


def github(body: bytes, delivery: str, event: str = "push", secret: str = GITHUB_SECRET) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={digest}", "X-GitHub-Delivery": delivery, "X-GitHub-Event": event}


def shopify(body: bytes, webhook_id: str, topic: str = "orders/create", secret: str = SHOPIFY_SECRET) -> dict[str, str]:
    digest = base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()
    return {"X-Shopify-Hmac-Sha256": digest, "X-Shopify-Webhook-Id": webhook_id, "X-Shopify-Topic": topic}


def slack(body: bytes, secret: str = SLACK_SECRET, ts: int | None = None) -> dict[str, str]:
    ts = int(time.time()) if ts is None else ts
    base = f"v0:{ts}:".encode() + body
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Signature": f"v0={digest}", "X-Slack-Request-Timestamp": str(ts)}


def generic_hmac(body: bytes, secret: str = HMAC_SECRET) -> dict[str, str]:
    digest = base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()
    return {"X-Signature": f"sha256={digest}"}


PROVIDERS_YAML = f"""
apiVersion: hookline.io/v1alpha1
kind: WebhookProvider
metadata: {{name: sw}}
spec:
  handler: "hookline.examples.handlers:log_event"
  signature: {{scheme: standard-webhooks, secrets: ["{SW_SECRET}", "{SW_SECRET_2}"]}}
---
kind: WebhookProvider
metadata: {{name: stripe}}
spec:
  handler: "hookline.examples.handlers:log_event"
  signature: {{scheme: stripe, secrets: ["{STRIPE_SECRET}"], toleranceSeconds: 300}}
  eventId: {{jsonPointer: /id}}
  eventType: {{jsonPointer: /type}}
  maxBodyBytes: 4096
  ordering:
    entityKey: {{jsonPointer: /data/object/id}}
    transitions:
      - {{on: payment_intent.created, from: [null], to: created}}
---
kind: WebhookProvider
metadata: {{name: github}}
spec:
  handler: "hookline.examples.handlers:log_event"
  signature: {{scheme: github, secrets: ["{GITHUB_SECRET}"]}}
---
kind: WebhookProvider
metadata: {{name: shopify}}
spec:
  handler: "hookline.examples.handlers:log_event"
  signature: {{scheme: shopify, secrets: ["{SHOPIFY_SECRET}"]}}
---
kind: WebhookProvider
metadata: {{name: slack}}
spec:
  handler: "hookline.examples.handlers:log_event"
  signature: {{scheme: slack, secrets: ["{SLACK_SECRET}"]}}
---
kind: WebhookProvider
metadata: {{name: generic}}
spec:
  handler: "hookline.examples.handlers:log_event"
  signature: {{scheme: hmac-sha256, header: X-Signature, encoding: base64, prefix: "sha256=",
              secrets: ["{HMAC_SECRET}"]}}
  eventId: {{header: X-Event-Id}}
---
kind: WebhookProvider
metadata: {{name: open}}
spec:
  handler: "hookline.examples.handlers:log_event"
  signature: {{scheme: none}}
---
kind: WebhookProvider
metadata: {{name: github-replay}}
spec:
  handler: "hookline.examples.handlers:log_event"
  signature: {{scheme: github, secrets: ["{GITHUB_SECRET}"]}}
  replayProtection: {{bodyHashWindowSeconds: 3600}}
"""


# --- raw HTTP, for requests no well-behaved client library would send ------------------------


def raw_request(port: int, head: bytes, body: bytes = b"", *, half_close: bool = False,
                timeout: float = 30.0) -> bytes:
    """Send ``head`` + ``body`` on a fresh connection and return every byte the server sends
    until it closes (b"" when it closes without answering). ``half_close`` ends our side
    after sending, like a client that gives up mid-body."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(head + body)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
        return answer


def status_of(answer: bytes) -> int | None:
    """The status code of the first response in ``answer``, or None when there was none."""
    if not answer.startswith(b"HTTP/1."):
        return None
    return int(answer.split(b" ", 2)[1])


def request_head(path: str, headers: list[tuple[bytes, bytes]]) -> bytes:
    lines = [f"POST {path} HTTP/1.1".encode(), b"Host: hookline.test", b"Connection: close"]
    lines += [name + b": " + value for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def stripe_raw(body: bytes, secret: str = STRIPE_SECRET, ts: int | None = None) -> dict[str, str]:
    """Stripe's signature over arbitrary bytes (stripe-python's signer wants text)."""
    ts = int(time.time()) if ts is None else ts
    digest = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={ts},v1={digest}"}
