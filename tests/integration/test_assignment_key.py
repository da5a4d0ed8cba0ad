"""Each job's key Secret (the key of assignments pushed to its agents), on the real control plane.

Why: the unit tests build the Secret and the pods' projected volume; here the API server
admits both (schema, owner reference, an optional Secret source), the key the operator writes
is the one it derives from its own key file again after a restart (it never reads the Secret
back: its RBAC holds no Secret reads), and the garbage collector deletes the Secret with its
job. Whether a pod's agent takes a push is for the worker tests and the e2e suite, where pods
run (kwok's pods have no agent).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from e2e.cluster.api import wait_for

from elastra.controller.decide.assignment_key import job_key, secret_name
from elastra_worker.push import KEY_FILE
from tests.integration.conftest import LocalCluster
from tests.integration.operator.conftest import OperatorProcess
from tests.integration.test_helm_install import cpu_job
from tests.integration.test_network_policy import live_pods


def key_secrets(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get("secrets", "-n", namespace)["items"]
    return [s for s in items if s["metadata"]["name"].endswith(f"-{KEY_FILE}")]


def test_a_job_gets_one_key_secret_derived_from_the_operators_key_and_owned_by_the_job(
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
        job = cluster.get("trainingjob", "keyed", "-n", namespace)
        (secret,) = key_secrets(cluster, namespace)
        assert secret["metadata"]["name"] == secret_name("keyed")
        assert secret["immutable"] is True
        (owner,) = secret["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("TrainingJob", job["metadata"]["uid"])
        derived = job_key(key_file.read_bytes(), namespace, "keyed", job["metadata"]["uid"])
        assert base64.b64decode(secret["data"][KEY_FILE]) == derived
        for pod in live_pods(cluster, namespace, "keyed"):
            (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "assignment"]
            sources = [next(iter(s)) for s in volume["projected"]["sources"]]
            assert sources == ["downwardAPI", "secret"]
            assert volume["projected"]["sources"][1]["secret"]["name"] == secret_name("keyed")
    finally:
        operator.stop()
        print("\n".join(["--- operator log (last 40 lines) ---", *operator.lines[-40:]]))

    cluster.kubectl("delete", "trainingjob", "keyed", "-n", namespace, "--wait=true")
    wait_for(
        "the key Secret garbage-collected with its job",
        lambda: not key_secrets(cluster, namespace),
        timeout=60,
        interval=0.5,
    )
