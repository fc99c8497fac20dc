"""Logging set-up: one JSON object per line by default, plain text with HOOKLINE_LOG_FORMAT=text."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

# Attributes every LogRecord has; anything else was passed with ``extra=`` and is logged as a field.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_PLAIN = (str, int, float, bool, type(None), list, dict)


def _fields(record: logging.LogRecord) -> dict[str, object]:
    """The record's extra fields; libraries' attached objects (kopf's settings, say) are left out."""
    return {k: v for k, v in vars(record).items()
            if k not in _STANDARD_ATTRS and not k.startswith(("_", "k8s_")) and isinstance(v, _PLAIN)}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return line


def setup(level: str | None = None) -> None:
    fmt = os.environ.get("HOOKLINE_LOG_FORMAT", "json").lower()
    if fmt not in ("json", "text"):
        raise SystemExit(f"HOOKLINE_LOG_FORMAT must be json or text, not {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or os.environ.get("HOOKLINE_LOG_LEVEL", "INFO")).upper())
    # aiohttp's access log is one line per request; metrics cover that.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
