"""The tools the suite builds once per machine (envtest, Prometheus, helm-docs, the local cluster): a
test that needs a missing one is skipped, or fails where the run requires it (CI sets the
HOOKLINE_REQUIRE_* variable)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(message: str, required_by: str) -> NoReturn:
    """Skip with ``message``, or fail with it when the variable ``required_by`` is 1."""
    if os.environ.get(required_by) == "1":
        pytest.fail(message)
    pytest.skip(message)
