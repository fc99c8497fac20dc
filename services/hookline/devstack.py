"""Finding the running ``hookline dev`` from another shell in the same checkout.

``hookline dev`` records where its stack is (database URL, receiver URL, key file) in
``<data dir>/dev-stack.json``, mode 0600 (the URL carries the embedded Postgres's password), once
its database is ready, and removes the record when it stops. A command run with
HOOKLINE_DATABASE_URL unset reads the record of the data dir (``.hookline`` in the working
directory, or HOOKLINE_DEV_DATA_DIR), uses that database and key file, and says so on stderr.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from hookline.core import settings
from hookline.core.config import ConfigError, redact_url

DATABASE_URL_ENV = settings.DATABASE_URL
DATA_DIR_ENV = settings.DEV_DATA_DIR
DEFAULT_DATA_DIR = Path(".hookline")
RECORD = "dev-stack.json"
DEFAULT_RECEIVER_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class DevStack:
    data_dir: Path
    database_url: str
    receiver_url: str
    secret_keys_file: str


def data_dir() -> Path:
    """Where a command looks for the dev stack's record: HOOKLINE_DEV_DATA_DIR, else ``.hookline``."""
    return settings.dev_data_dir(DEFAULT_DATA_DIR)


def receiver_url(host: str, port: int) -> str:
    """The receiver's URL as another process on this machine reaches it."""
    reachable = "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host
    return f"http://[{reachable}]:{port}" if ":" in reachable else f"http://{reachable}:{port}"


def record(directory: Path, database_url: str, receiver: str, secret_keys_file: Path) -> None:
    """Write the record (mode 0600 from its creation: it holds a password), replacing any older one."""
    path = directory / RECORD
    partial = directory / (RECORD + ".partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"database_url": database_url, "receiver_url": receiver,
                   "secret_keys_file": str(secret_keys_file)}, out)
    os.replace(partial, path)


def forget(directory: Path) -> None:
    (directory / RECORD).unlink(missing_ok=True)


def find(directory: Path | None = None) -> DevStack | None:
    """The recorded dev stack of ``directory`` (default: ``data_dir()``), or None when there is none."""
    directory = directory or data_dir()
    path = directory / RECORD
    try:
        if path.stat().st_uid != os.getuid():  # not ours: another user's database, or a trap in a shared directory
            raise ConfigError(f"{path} belongs to another user: set {DATABASE_URL_ENV} instead")
        found = json.loads(path.read_text())
        return DevStack(directory, str(found["database_url"]), str(found["receiver_url"]),
                        str(found["secret_keys_file"]))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{path} is not a hookline dev record: delete it, or set {DATABASE_URL_ENV}") from None


def use_dev_stack() -> str | None:
    """With HOOKLINE_DATABASE_URL unset, point this process at the running dev stack (its database
    and key file); return the line that says so, or None when the environment decides (or there is
    no record). A record whose Postgres does not answer is a ConfigError: a dev that did not stop."""
    if settings.database_url_given():
        return None
    stack = find()
    if stack is None:
        return None
    parts = urlsplit(stack.database_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    if not _answers(host, port):
        raise ConfigError(f"{stack.data_dir / RECORD} names a hookline dev database at {host}:{port} that does "
                          f"not answer (that dev is not running): start `hookline dev`, or set {DATABASE_URL_ENV}")
    from hookline.core.secrets_at_rest import KEYS_FILE_ENV

    os.environ[DATABASE_URL_ENV] = stack.database_url
    if settings.keys_file() is None:
        os.environ[KEYS_FILE_ENV] = stack.secret_keys_file
    return f"hookline: using the hookline dev database of {stack.data_dir} ({redact_url(stack.database_url)})"


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False
