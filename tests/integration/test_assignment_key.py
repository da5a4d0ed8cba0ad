"""The public key of pushed assignments in every worker pod, on the real control plane.

Why: the unit tests build the pods' environment; here the API server admits it (the pod's uid
from the downward API, the public key as a literal), the key in the pods is the one the
operator derives from its key file (so a restarted operator signs as its running pods
expect), and the operator creates no Secret for it (its RBAC holds none). Whether a pod's
agent takes a push is for the worker tests and the e2e suite, where pods run (kwok's pods
have no agent).
"""

from __future__ import annotations

from pathlib import Path

from e2e.cluster.api import wait_for

from elastra.controller.decide.assignment_key import signing_key
from elastra_worker.push import POD_UID_ENV, PUBLIC_KEY_ENV, public_key_text
from tests.integration.conftest import LocalCluster
from tests.integration.operator.conftest import OperatorProcess
from tests.integration.test_helm_install import cpu_job
from tests.integration.test_network_policy import live_pods


def test_every_worker_pod_gets_the_public_key_of_the_operators_key_file_and_no_secret(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    key_file = tmp_path / "operator-key"
    key_file.write_bytes(b"an operator key of the chart, 48 characters long")
    operator = OperatorProcess(
        cluster, namespace, extra_args=(f"--assignment-key-file={key_file}",)
    )
    operator.start()
    try:
        cluster.apply(cpu_job("keyed"), namespace=namespace)
        wait_for("2 workers", lambda: len(live_pods(cluster, namespace, "keyed")) == 2, timeout=60)
        expected = public_key_text(signing_key(key_file.read_bytes()))
        for pod in live_pods(cluster, namespace, "keyed"):
            (worker,) = [c for c in pod["spec"]["containers"] if c["name"] == "worker"]
            env = {e["name"]: e for e in worker["env"]}
            assert env[PUBLIC_KEY_ENV]["value"] == expected
            assert env[POD_UID_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
        assert cluster.get("secrets", "-n", namespace)["items"] == []
    finally:
        operator.stop()
        print("\n".join(["--- operator log (last 40 lines) ---", *operator.lines[-40:]]))
