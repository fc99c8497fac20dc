"""The operator reports whether it reaches Postgres and the API server (hookline_operator_dependency_up),
which the HooklineOperator*Unreachable alerts read: 1 against the real API server and Postgres,
0 for an API server that does not answer."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from apiserver import ApiServer
from kubernetes import client

from hookline.core.embedded import free_port
from hookline_operator.apiserver_probe import api_server_answers
from support.operator import start_operator
from support.waiting import eventually_sync


def _api_client(host: str, token: str, ca_file: Path) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = host
    configuration.ssl_ca_cert = str(ca_file)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)


def test_probe_tells_an_answering_api_server_from_a_silent_port(apiserver: ApiServer) -> None:
    assert api_server_answers(_api_client(apiserver.url, apiserver.admin_token, apiserver.ca_file)) is True
    assert api_server_answers(_api_client(f"https://127.0.0.1:{free_port()}", "x", apiserver.ca_file)) is False


def test_operator_exports_both_dependencies_up(apiserver: ApiServer, namespace: str, database_url: str,
                                               log_dir: Path) -> None:
    operator = start_operator(apiserver, [namespace], database_url, log_dir)
    try:
        def exported() -> str:
            with urllib.request.urlopen(f"{operator.url}/metrics", timeout=5) as response:
                return str(response.read().decode())

        for dependency in ("kubernetes", "postgres"):
            line = f'hookline_operator_dependency_up{{dependency="{dependency}"}} 1.0'
            eventually_sync(lambda line=line: line in exported(), what=line)
    finally:
        operator.stop()
