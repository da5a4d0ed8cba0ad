"""A steady job costs the API server nothing: passes read the informers' caches.

The operator's own counter (``elastra_api_requests_total``, by verb and resource, scraped
from its metrics endpoint) is read before and after a 35 s window in which a placed, running
job has nothing to do, while passes keep running every 5 s (``--resync-seconds=5``) from the
caches. Every request Elastra's client makes is counted, watches included: a watch opened
before the window and still open is not a request in it, one reopened in it is (verb WATCH).
The informers' watches run 300 to 600 s (``watch_timeout``), and the window ends well inside
300 s of the operator's start (asserted), so a reopened watch would be a real regression.

Not counted: the Lease renewals (a GET and a PUT every 5 s: the operator's heartbeat, the
same with no job or a thousand; reported below, excluded from the assertion), and Kopf's own
streams (its Workload and CRD watches, through Kopf's client), which do not depend on jobs.
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter

from elastra_worker.launcher import free_ports
from tests.integration.conftest import LocalCluster
from tests.integration.operator.conftest import (
    Jobs,
    OperatorProcess,
    gpu_job,
    http_get,
)

WINDOW_S = 35.0
WATCHES_LAST_S = 300.0
"""The shortest watch the informers ask for (half of the default ``watch_timeout``)."""
SAMPLE = re.compile(r"^elastra_api_requests_total\{([^}]*)\} ([0-9.e+]+)$", re.M)


def requests_made(port: int) -> Counter[tuple[str, str]]:
    """The operator's requests so far, by (verb, resource)."""
    text = http_get(f"http://127.0.0.1:{port}/metrics")
    assert text is not None, "the operator's metrics endpoint does not answer"
    counts: Counter[tuple[str, str]] = Counter()
    for labels, value in SAMPLE.findall(text):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        counts[(found["verb"], found["resource"])] += int(float(value))
    return counts


def test_a_steady_job_costs_zero_api_requests(
    cluster: LocalCluster, jobs: Jobs, private_nodes: list[str]
) -> None:
    port = free_ports(1)
    operator = OperatorProcess(cluster, jobs.namespace, extra_args=(f"--metrics-port={port}",))
    started = time.monotonic()
    operator.start()
    try:
        job = gpu_job("steady", replicas=2)
        job["spec"]["worker"]["gpuTypes"] = ["H200"]
        jobs.apply(job)
        status = jobs.wait_phase("steady", "Running", timeout=120)
        assert status["world"]["replicas"] == 2
        jobs.wait(
            "both workers Running",
            lambda: (
                (pods := jobs.pods("steady"))
                and len(pods) == 2
                and all(p["status"].get("phase") == "Running" for p in pods)
            ),
        )
        seen = operator.quiet_passes("steady")
        jobs.wait("a quiet pass", lambda: operator.quiet_passes("steady") > seen, timeout=30)
        before, passes = requests_made(port), operator.quiet_passes("steady")
        assert time.monotonic() - started + WINDOW_S < WATCHES_LAST_S, "too slow to be steady"
        time.sleep(WINDOW_S)  # the observation window itself: nothing is awaited in it
        after, passed = requests_made(port), operator.quiet_passes("steady") - passes
    finally:
        operator.stop()
    spent = after - before
    leases = {k: v for k, v in spent.items() if k[1] == "leases"}
    job_work = {k: v for k, v in spent.items() if k[1] != "leases"}
    sys.stderr.write(
        f"\nsteady window {WINDOW_S:.0f} s: {passed} passes, requests {dict(job_work)}, "
        f"lease renewals {dict(leases)}, before the window {dict(before)}\n"
    )
    assert passed >= 5, "passes kept running (every 5 s) from the caches"
    assert job_work == {}, f"a steady job made API requests: {dict(job_work)}"
    assert status["world"]["version"] == jobs.status("steady")["world"]["version"]
