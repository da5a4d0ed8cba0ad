"""Kubeconfigs and transient answers against the real API server.

``elastra status`` and ``elastra run`` (its own client and Kopf's login) log in through an
exec plugin (a script written here that hands out the test cluster's admin client certificate
as an ExecCredential, counting its runs), an unreachable server is one line, and a list that
asks for a resourceVersion the server has not reached (504 "Too large resource version", after
the server's own wait) is retried until the server catches up. The catch-up is deterministic:
the test's injected sleep writes objects, which move the server's resourceVersion past the
one asked for.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.cluster.api import WaitTimeoutError, wait_for

from elastra.kube.client import Kube, RetryPolicy
from elastra.kube.config import load_connection
from tests.cases.specs import base_manifest
from tests.integration.conftest import LocalCluster
from tests.integration.operator.conftest import OperatorProcess

PLUGIN = """#!{python}
import base64, json, os, pathlib, yaml
state = pathlib.Path({state!r})
calls = int(state.read_text()) + 1 if state.exists() else 1
state.write_text(str(calls))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
user = yaml.safe_load(pathlib.Path({admin!r}).read_text())["users"][0]["user"]
status = {{
    "clientCertificateData": base64.b64decode(user["client-certificate-data"]).decode(),
    "clientKeyData": base64.b64decode(user["client-key-data"]).decode(),
}}
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}}))
"""


def exec_kubeconfig(cluster: LocalCluster, tmp_path: Path) -> tuple[Path, Path]:
    """A kubeconfig for the test cluster whose user is an exec plugin; and its call counter."""
    admin: dict[str, Any] = yaml.safe_load(cluster.kubeconfig.read_text())
    state = tmp_path / "plugin-calls"
    plugin = tmp_path / "admin-plugin"
    plugin.write_text(
        PLUGIN.format(python=sys.executable, state=str(state), admin=str(cluster.kubeconfig))
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [
            {
                "name": "via-plugin",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": "./admin-plugin",
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": "plugged", "context": {"cluster": "local", "user": "via-plugin"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path, state


def elastra(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "elastra.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_status_logs_in_through_an_exec_plugin(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    cluster.apply(base_manifest("plugged"), namespace=namespace)
    kubeconfig, calls = exec_kubeconfig(cluster, tmp_path)
    done = elastra(
        "status", "plugged", "-n", namespace, f"--kubeconfig={kubeconfig}", "--context=plugged"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"TrainingJob {namespace}/plugged: ")
    assert calls.read_text() == "1"  # one run served both requests (job and events)


def test_unreachable_server_is_one_line(cluster: LocalCluster, tmp_path: Path) -> None:
    kubeconfig, _ = exec_kubeconfig(cluster, tmp_path)
    config = yaml.safe_load(kubeconfig.read_text())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        server = f"https://127.0.0.1:{probe.getsockname()[1]}"
    config["clusters"][0]["cluster"]["server"] = server
    kubeconfig.write_text(yaml.safe_dump(config))
    done = elastra("status", "x", f"--kubeconfig={kubeconfig}", "--context=plugged")
    assert done.returncode == 3
    assert done.stdout == ""
    assert done.stderr == (
        f"elastra: error: cannot reach the API server at {server} (connection refused): "
        f"is the cluster up? (kubeconfig {kubeconfig}, context plugged)\n"
    )


GAPS = (50, 400, 3200)
"""How far ahead of the server the list asks. The server waits about 3 s for its cache to
reach that version before it answers 504; a quiet cluster makes few writes meanwhile, but one
still cleaning up an earlier test's namespaces made more than 50 (CI: the list was answered at
once, no 504 to retry). A larger gap is tried only when such writes caught up with the last."""


def test_too_large_resource_version_is_retried(
    cluster: LocalCluster, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="elastra.kube")
    connection = load_connection(str(cluster.kubeconfig))
    delays: list[float] = []
    path = f"/api/v1/namespaces/{namespace}/configmaps"

    async def scenario(gap: int) -> dict[str, Any] | None:
        """The list's answer after one 504 and its retry; None when no 504 came."""
        async with Kube(connection) as writer:
            listed = await writer.request("GET", path)
            ahead = int(listed["metadata"]["resourceVersion"]) + gap

            async def catch_up(seconds: float) -> None:
                """The retry's wait: writes move the server past the version asked for."""
                delays.append(seconds)
                for tick in range(gap + 1):
                    made = await writer.create(path, {"metadata": {"name": f"tick-{gap}-{tick}"}})
                    if made and int(made["metadata"]["resourceVersion"]) >= ahead:
                        return

            kube = Kube(connection, retry=RetryPolicy(attempts=3, sleep=catch_up))
            async with kube:
                params = {"resourceVersion": str(ahead), "resourceVersionMatch": "NotOlderThan"}
                answer = await kube.request("GET", path, params=params)
                return answer if kube.requests["GET"] > 1 else None

    for gap in GAPS:
        caplog.clear()
        answer = asyncio.run(scenario(gap))
        if answer is not None:
            break
    assert answer is not None, f"no 504 provoked: other writes caught up with every gap {GAPS}"
    assert delays == [1.0]  # one 504 with Retry-After: 1, then the list
    (retried,) = [r.getMessage() for r in caplog.records if "retry in" in r.getMessage()]
    assert retried.startswith(f"GET {path}: 504 Timeout: ")
    assert "Too large resource version" in retried
    assert answer["kind"] == "ConfigMapList"
    assert f"tick-{gap}-0" in [c["metadata"]["name"] for c in answer["items"]]


def test_operator_and_kopf_log_in_through_the_exec_plugin(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """Kopf's watch sees the job (login handler) and Elastra's client writes its status."""
    kubeconfig, calls = exec_kubeconfig(cluster, tmp_path)
    cluster.apply(base_manifest("watched"), namespace=namespace)
    operator = OperatorProcess(
        cluster, namespace, extra_args=(f"--kubeconfig={kubeconfig}", "--context=plugged")
    )
    operator.start()
    try:
        wait_for(
            "the operator wrote the job's phase",
            lambda: cluster.get("tj", "watched", "-n", namespace).get("status", {}).get("phase"),
            timeout=90,
        )
    except WaitTimeoutError:
        print("\n".join(operator.lines[-40:]))  # the operator's log, for the failure report
        raise
    finally:
        operator.stop()
    assert calls.read_text() == "1"  # one plugin run served Elastra's client and Kopf's login
