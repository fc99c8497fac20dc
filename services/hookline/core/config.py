"""The error of bad configuration, and printing a database URL safely (the settings: core/settings.py)."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad or missing configuration; the message says what to set. A ValueError, as a bad value is."""


def redact_url(url: str) -> str:
    """The URL with its password (and the client key's ``sslpassword``) replaced, safe to print or log."""
    import re
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    query = re.sub(r"(?i)((?:^|&)sslpassword=)[^&]*", r"\1***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))
