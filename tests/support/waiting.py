"""Waiting for something the code under test makes observable: the suite's one polling helper.

``await eventually(check, what=...)`` in async tests (the event loop keeps running between
looks), ``eventually_sync`` in plain tests. A check may be sync or async; an exception it raises
counts as "not yet" (only those of the ``ignoring`` types, when given: any other ends the wait at
once); a timeout fails the test with ``what`` and the last value seen.

Negative checks wait the same way, for the event after which the forbidden thing would have
happened (a finished timer run, a statement waiting on a lock, a counted outcome), and then
assert that it did not happen: never a sleep and then an assertion.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# A timeout only ever ends a failing test, so it is generous: the machine may be busy.
TIMEOUT = 60.0
INTERVAL = 0.05
_TRUTHY = object()


class _Polling:
    """One wait's bookkeeping: whether a value is the one awaited, and how long to pause next."""

    def __init__(self, check: Callable[..., Any], what: str | None, timeout: float, interval: float,
                 equals: object) -> None:
        self.check = check
        self.what = what
        self.timeout = timeout
        self.interval = interval
        self.equals = equals
        self.deadline = time.monotonic() + timeout
        self.last: object = None
        self.looked_at = 0.0

    def met(self, value: object) -> bool:
        self.last = value
        return bool(value) if self.equals is _TRUTHY else value == self.equals

    def failed(self, exc: Exception) -> None:
        self.last = exc

    def pause(self) -> float:
        """Seconds to sleep before the next look; AssertionError once the time is up. A slow check
        (kubectl, a query on a busy machine) waits up to five intervals between looks."""
        now = time.monotonic()
        if now >= self.deadline:
            expected = "" if self.equals is _TRUTHY else f", expected {self.equals!r}"
            error = AssertionError(f"timed out after {self.timeout:g} s waiting for {self.description()}: "
                                   f"last {self.last!r}{expected}")
            raise error from self.last if isinstance(self.last, Exception) else None
        took = now - self.looked_at
        return min(max(self.interval, min(took, 5 * self.interval)), self.deadline - now)

    def description(self) -> str:
        if self.what:
            return self.what
        try:
            return inspect.getsource(self.check).strip()
        except (OSError, TypeError):
            return repr(self.check)


async def eventually(check: Callable[[], T | Awaitable[T]], *, what: str | None = None, timeout: float = TIMEOUT,
                     interval: float = INTERVAL, equals: object = _TRUTHY,
                     ignoring: tuple[type[Exception], ...] = (Exception,)) -> T:
    """Look at ``check()`` (awaited when it returns an awaitable) until its value is truthy, or
    ``== equals`` when given; return that value. Exceptions of the ``ignoring`` types mean "not yet"."""
    polling = _Polling(check, what, timeout, interval, equals)
    while True:
        polling.looked_at = time.monotonic()
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if polling.met(value):
                return value
        except ignoring as exc:
            polling.failed(exc)
        await asyncio.sleep(polling.pause())


def eventually_sync(check: Callable[[], T], *, what: str | None = None, timeout: float = TIMEOUT,
                    interval: float = INTERVAL, equals: object = _TRUTHY,
                    ignoring: tuple[type[Exception], ...] = (Exception,)) -> T:
    """``eventually`` for code without an event loop (sync tests and fixtures)."""
    polling = _Polling(check, what, timeout, interval, equals)
    while True:
        polling.looked_at = time.monotonic()
        try:
            value = check()
            if polling.met(value):
                return value
        except ignoring as exc:
            polling.failed(exc)
        time.sleep(polling.pause())
