"""Process-wide settings read from the environment (the names are part of the contract)."""

from __future__ import annotations

import os


class ConfigError(ValueError):
    """Bad or missing configuration; the message says what to set. A ValueError, as a bad value is."""


def database_url() -> str:
    url = os.environ.get("HOOKLINE_DATABASE_URL", "").strip()
    if not url:
        raise ConfigError(
            "HOOKLINE_DATABASE_URL is not set: point it at Postgres, e.g. "
            "postgresql://user:password@localhost:5432/hookline (or run `hookline dev`)"
        )
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError("HOOKLINE_DATABASE_URL must be a postgresql:// URL")
    return url


def env_flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def redact_url(url: str) -> str:
    """The URL with its password replaced, safe to print or log."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
