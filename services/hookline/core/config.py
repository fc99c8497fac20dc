"""The error of bad configuration, and printing a database URL safely (the settings: core/settings.py)."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad or missing configuration; the message says what to set. A ValueError, as a bad value is."""


def redact_url(url: str) -> str:
    """The URL with its password replaced, safe to print or log."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
