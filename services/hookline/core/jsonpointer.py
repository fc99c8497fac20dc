"""RFC 6901 JSON pointers: enough to pick an event id, type or entity key out of a body."""

from __future__ import annotations

from typing import Any

_MISSING = object()


def resolve(document: Any, pointer: str) -> Any:
    """The value at ``pointer`` in ``document``, or None when any step is missing."""
    if pointer == "":
        return document
    node = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(token, _MISSING)
        elif isinstance(node, list) and token.isdigit():
            index = int(token)
            node = node[index] if index < len(node) else _MISSING
        else:
            return None
        if node is _MISSING:
            return None
    return node
