"""End to end: a job that checkpoints to S3 (``checkpoint.uri``) resizes and resumes from it.

Why: object storage is how most clusters share checkpoints between nodes; a job with
``checkpoint.uri`` and no volume must keep its progress across a resize exactly as one on a
shared claim does. The S3 server is moto's (a real S3 API over HTTP) started by this test on
this machine's own address, which the real node's pods reach; the credentials come from a
Secret through ``spec.worker.template``, the endpoint from ``AWS_ENDPOINT_URL``, as the docs
tell users. The job is cpu-tiny with its claim replaced by the URI.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from typing import Any

import boto3  # type: ignore[import-untyped]
import pytest
from e2e.elasticjob import RUNNING_STEPS, Elastra, JobRun, example_job
from e2e.kube import KubeError
from e2e.node.node import node_ip
from e2e.trainlog import check_resumes, resumes
from moto.server import ThreadedMotoServer

from elastra_worker.agent import IN_MEMORY_RESIZE_ENV

pytestmark = pytest.mark.timeout(1500)

NAME = "cpu-tiny-s3"
BUCKET, PREFIX = "elastra-e2e", "checkpoints"
SECRET = "cpu-tiny-s3-credentials"
KEY_ID, KEY = "elastra-e2e", "elastra-e2e-secret"
STEPS_PER_WORLD = 3


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on this machine's own address (pods cannot reach its loopback)."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address=node_ip(), port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    s3_client(endpoint).create_bucket(Bucket=BUCKET)
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_job(elastra: Elastra, s3_endpoint: str) -> Iterator[JobRun]:
    kube, namespace = elastra.kube, elastra.setup.job_namespace
    # The suite's other jobs hold the node's CPU: this one runs alone.
    elastra.job.delete()
    with contextlib.suppress(KubeError, TimeoutError):
        JobRun(kube, namespace, "llama-tiny-3d").delete(timeout=240)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": namespace},
        "stringData": {"access-key-id": KEY_ID, "secret-access-key": KEY},
    }
    kube.apply([secret, s3_manifest(namespace, s3_endpoint)])
    job = JobRun(kube, namespace, NAME, operator=elastra.setup.operator)
    try:
        yield job
    finally:
        job.delete(timeout=240)
        kube.kubectl("delete", "secret", SECRET, "-n", namespace, "--ignore-not-found")


def s3_manifest(namespace: str, endpoint: str) -> dict[str, Any]:
    """cpu-tiny with ``checkpoint.uri`` in place of its claim, two workers to start."""
    job = copy.deepcopy(example_job(namespace, steps=RUNNING_STEPS))
    job["metadata"]["name"] = NAME
    spec = job["spec"]
    spec["replicas"] = 2
    spec["checkpoint"] = {"uri": f"s3://{BUCKET}/{PREFIX}", "intervalSeconds": 30, "keep": 3}
    spec["worker"]["env"] = [
        {"name": "AWS_ENDPOINT_URL", "value": endpoint},
        {"name": "AWS_DEFAULT_REGION", "value": "us-east-1"},
        # No instance-metadata lookups (a link-local address) for credentials: they are below.
        {"name": "AWS_EC2_METADATA_DISABLED", "value": "true"},
        # Every resize restarts its trainers, which read the state back from the object store:
        # what this test is for (in memory, the grow's new rank would take it from a peer).
        {"name": IN_MEMORY_RESIZE_ENV, "value": "0"},
    ]
    spec["worker"]["template"] = {
        "spec": {
            "containers": [
                {
                    "name": "worker",
                    "env": [
                        secret_env("AWS_ACCESS_KEY_ID", "access-key-id"),
                        secret_env("AWS_SECRET_ACCESS_KEY", "secret-access-key"),
                    ],
                }
            ]
        }
    }
    return job


def secret_env(name: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": key}}}


def s3_client(endpoint: str) -> Any:
    """A client of the test's S3 server with the job's credentials."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=KEY,
        region_name="us-east-1",
    )


def committed_keys(endpoint: str) -> list[str]:
    """The objects under the prefix (the job's root holds ``latest`` once a step committed)."""
    found = s3_client(endpoint).list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)
    return [str(o["Key"]) for o in found.get("Contents", [])]


def test_a_job_on_object_storage_grows_and_resumes_from_it(
    s3_job: JobRun, s3_endpoint: str
) -> None:
    job = s3_job
    two = job.wait_world(2, after=0)
    commits_before = _rank0_commits(job)
    job.wait_for_log("rank 0 committed step", after=commits_before)
    assert any(k.endswith("/latest") for k in committed_keys(s3_endpoint)), committed_keys(
        s3_endpoint
    )
    job.snapshot_logs()
    job.scale(3)
    three = job.wait_world(3, after=two)
    job.wait_for_log("restored step", after=0)
    found = resumes(job.log_lines())
    assert [r.world_size for r in found][-1:] == [3], found
    check_resumes(found)
    assert three > two


def _rank0_commits(job: JobRun) -> int:
    return sum("rank 0 committed step" in line for line in job.log_lines())
