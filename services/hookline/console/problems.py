"""Errors as RFC 9457 problem details (``application/problem+json``): type, title, status, detail.

Every error the console's API answers is one of these, raised as ``Problem`` by a handler or made
by the app's middleware from what went wrong (a 500 says nothing of the internals)."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from aiohttp import web

CONTENT_TYPE = "application/problem+json"
TYPE_BASE = "https://hookline.io/problems/"


class Problem(Exception):
    """An error answer; ``field`` names the request parameter that was wrong, when one was."""

    def __init__(self, status: int, detail: str, *, field: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.field = field
        self.code = code or HTTPStatus(status).phrase.lower().replace(" ", "-")
        self.headers = headers or {}

    def response(self) -> web.Response:
        body: dict[str, Any] = {"type": TYPE_BASE + self.code, "title": HTTPStatus(self.status).phrase,
                                "status": self.status, "detail": self.detail}
        if self.field is not None:
            body["field"] = self.field
        return web.Response(status=self.status, text=json.dumps(body), content_type=CONTENT_TYPE,
                            headers=self.headers)


def bad_request(field: str, detail: str) -> Problem:
    return Problem(400, detail, field=field, code="invalid-parameter")


def unauthorized(detail: str = "give a bearer token: Authorization: Bearer TOKEN") -> Problem:
    return Problem(401, detail, code="unauthorized", headers={"WWW-Authenticate": 'Bearer realm="hookline"'})


def forbidden(detail: str) -> Problem:
    return Problem(403, detail, code="forbidden")


def not_found(detail: str) -> Problem:
    return Problem(404, detail, code="not-found")


def internal() -> Problem:
    return Problem(500, "the console could not answer; its log says why", code="internal")
