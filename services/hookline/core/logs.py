"""Logging set-up: JSON lines for services, readable lines for people.

The format is HOOKLINE_LOG_FORMAT (json or text) when set (read in core/settings.py). Otherwise a person is assumed to
read the logs of `hookline dev` and of any command whose stderr is a terminal, and gets text;
everything else (a service under Kubernetes, systemd, a pipe) gets one JSON object per line.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hookline.core.settings import LogSettings

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
    """``12:00:01.234 WARNING hookline.worker: event dead provider=stripe error="HTTP 500"``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s", datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if fields:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        return line


def _text_value(value: object) -> str:
    text = str(value)
    return json.dumps(text) if not text or any(c.isspace() or c in "\"=" for c in text) else text


def setup(settings: LogSettings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level)
    # aiohttp's access log is one line per request; metrics cover that.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
