"""The operator these tests run (support/operator.py) is the chart's operator, not the admin: its
kubeconfig is a ServiceAccount token bound to the Role the chart renders, asked with the real
`kubectl auth can-i` as that identity. So every operator scenario in tests/operator proves that the
chart's Role is enough, and the verbs the chart no longer grants are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from apiserver import ApiServer

from support.operator import ACCOUNT, ACCOUNT_NAMESPACE, operator_kubeconfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chart"))
from operator_access import OPERATOR_NEEDS, REMOVED


def as_operator(apiserver: ApiServer, kubeconfig: Path, *args: str) -> str:
    argv = [str(apiserver.assets / "kubectl"), f"--kubeconfig={kubeconfig}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()


def test_the_operator_under_test_has_the_charts_role_and_nothing_more(apiserver: ApiServer, namespace: str,
                                                                      tmp_path: Path) -> None:
    kubeconfig = operator_kubeconfig(apiserver, [namespace], tmp_path)
    whoami = json.loads(as_operator(apiserver, kubeconfig, "auth", "whoami", "-o", "json"))
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{ACCOUNT_NAMESPACE}:{ACCOUNT}"

    def can_i(verb: str, resource: str, *extra: str, ns: str = namespace) -> bool:
        return as_operator(apiserver, kubeconfig, "auth", "can-i", verb, resource, "-n", ns, *extra) == "yes"

    assert [n for n in OPERATOR_NEEDS if not can_i(*n)] == []
    assert [n for n in [*REMOVED, ("list", "secrets"), ("watch", "secrets"), ("delete", "secrets")]
            if can_i(*n)] == []
    # Nothing outside the namespaces it watches.
    assert not can_i("get", "secrets", ns="default") and not can_i("list", "webhookproviders.hookline.io", ns="default")
