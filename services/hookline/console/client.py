"""``hookline events …`` and ``hookline dlq …`` through a console's API (``--api URL``) instead of
the database: for a team whose access is a Kubernetes token, not a database URL. Prints what the
database-side commands print, from the API's answers (the same records)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from hookline.core.history import HistoryError, event_lines, table

TIMEOUT = 30.0


class ApiClient:
    def __init__(self, base: str, token: str) -> None:
        if not base.startswith(("http://", "https://")):
            raise HistoryError(f"--api must be the console's http(s) URL, not {base!r}")
        self.base = base.rstrip("/") + "/api/v1"
        self.token = token

    def call(self, method: str, path: str, params: dict[str, str | None] | None = None,
             body: dict[str, Any] | None = None) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
        request = urllib.request.Request(self.base + path + (f"?{query}" if query else ""), method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("detail", exc.reason)
            except ValueError:
                detail = exc.reason
            raise HistoryError(f"the console answered {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            raise HistoryError(f"cannot reach the console at {self.base}: {exc.reason}") from None


def _quoted(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _event_rows(items: list[dict[str, Any]]) -> list[str]:
    return table(("ID", "PROVIDER", "EVENT ID", "TYPE", "STATUS", "ATTEMPTS", "RECEIVED AT", "LAST ERROR"),
                 [(str(e["id"]), e["provider"], e["event_id"], e["event_type"] or "-", e["status"],
                   str(e["attempts"]), e["received_at"], (e["last_error"] or "")[:80]) for e in items],
                 right={0, 5})


def list_events(client: ApiClient, *, provider: str | None, status: str | None, since: str | None,
                limit: int, dead_only: bool = False) -> list[str]:
    items: list[dict[str, Any]] = []
    cursor = None
    while len(items) < limit:
        page = client.call("GET", "/dead-letters" if dead_only else "/events",
                           {"provider": provider, "status": status, "received_after": since,
                            "limit": str(min(200, limit - len(items))), "cursor": cursor})
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    return _event_rows(items)


def event_record(client: ApiClient, provider: str, event_id: str) -> dict[str, Any]:
    """The API's event in the shape `hookline events show` prints (history.event_record's)."""
    event: dict[str, Any] = client.call("GET", f"/events/{_quoted(provider)}/{_quoted(event_id)}")
    body = event.pop("body")
    event["body_preview"] = body[:512] + (f"... ({event['body_bytes']} bytes in all)" if len(body) > 512 else "")
    for key in ("body_json", "body_is_json", "body_truncated", "body_valid_utf8"):
        event.pop(key, None)
    for attempt in event["attempt_log"]:
        traceback = attempt.pop("traceback")
        if traceback:
            attempt["error"] = f"{attempt['error'] or ''}\n{traceback}"
    return event


def show_event(client: ApiClient, provider: str, event_id: str, output: str) -> list[str]:
    record = event_record(client, provider, event_id)
    return [json.dumps(record, indent=2)] if output == "json" else event_lines(record)


def replay(client: ApiClient, *, provider: str | None, event_type: str | None, event: str | None) -> list[str]:
    if event is not None:
        name, sep, event_id = event.partition(":")
        if not sep or not name or not event_id:
            raise HistoryError(f"--event with --api is PROVIDER:EVENT_ID, not {event!r}")
        result = client.call("POST", f"/events/{_quoted(name)}/{_quoted(event_id)}/replay", body={})
        if not result["count"]:
            raise HistoryError(f"event {event} is not dead: only dead events are replayed")
        return [f"{event}: requeued (attempts start again)"]
    result = client.call("POST", "/dead-letters/replay",
                         body={"filter": {k: v for k, v in (("provider", provider), ("type", event_type)) if v}})
    if not result["count"]:
        return ["no dead events matched"]
    lines = [f"{name}: requeued {n} dead event(s)" for name, n in sorted(result.get("providers", {}).items())]
    return lines + (["more remain: run it again"] if result["more"] else [])
