"""Whether the operator can reach the Kubernetes API server, as a gauge the alerts read.

kopf's watches fail and retry silently from the outside; this probe asks the API server for its
version (``/version``, readable by every identity) once per interval and sets
``hookline_operator_dependency_up{dependency="kubernetes"}``. The statistics loop sets the
``postgres`` one the same way (``stats.refresh``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubernetes import client

from hookline.core import metrics
from hookline.core.tasks import cancel_and_wait
from hookline_operator.kube import load_config
from hookline_operator.memo import OperatorMemo

log = logging.getLogger("hookline.operator")

PROBE_TIMEOUT = 10.0  # seconds; a slower answer counts as no answer


def api_server_answers(api: Any) -> bool:
    """True when the API server answered ``/version`` (any HTTP answer but 401 or 5xx counts)."""
    try:
        client.VersionApi(api).get_code(_request_timeout=PROBE_TIMEOUT)
    except client.exceptions.ApiException as exc:
        status = int(exc.status or 0)
        return status != 401 and 0 < status < 500
    except Exception as exc:  # connection refused, TLS, DNS, timeout: all mean unreachable
        log.warning("Kubernetes API server unreachable", extra={"error": f"{type(exc).__name__}: {exc}"})
        return False
    return True


async def probe_forever(api: Any, interval: float) -> None:
    gauge = metrics.operator_dependency_up.labels("kubernetes")
    while True:
        gauge.set(int(await asyncio.to_thread(api_server_answers, api)))
        await asyncio.sleep(interval)


async def start_probe(memo: OperatorMemo, **_: Any) -> None:
    load_config()
    api = client.ApiClient(client.Configuration.get_default_copy())
    memo.tasks.append(asyncio.create_task(probe_forever(api, memo.interval), name="apiserver-probe"))


async def stop_probe(memo: OperatorMemo, **_: Any) -> None:
    await cancel_and_wait(*[t for t in memo.tasks if t.get_name() == "apiserver-probe"])
