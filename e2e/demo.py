"""`make demo`: Elastra end to end on this machine, in one command, with one summary line.

Why: a user's first question is "does it really resize a training job without losing work?".
The demo answers it with real parts: it builds what is missing (toolchain, images; the venv
is made by `make`), starts the local control plane with this machine's real node, installs
Elastra with Helm into namespaces that enforce Pod Security "restricted", runs
examples/cpu-tiny.yaml (three CPU workers training a tiny GPT over gloo), scales it to two and
back to three, and checks the workers' own records. The last line is either

    demo: OK worlds=v1(3)->v2(2)->v3(3) steps=N resumed-from=[a,b] downtime=[Xs,Ys]
        scale-to-step=[Xs,Ys] goodput=G% data-order=static

(world versions with their sizes, the steps trained, the checkpoint step each resize resumed
from, how long each resize stopped training: from the end of the step the new world resumed
from to the end of its first step, as its rank 0 recorded it; from each `kubectl scale` to the
end of the new world's first step, a new pod's start included (the grow follows a scale-down,
so the resize policy's cooldown does not hold it): the lines before it say when the world
formed and when the new pod turned Ready; the job's goodput at its last
step: the fraction of wall time since its first step spent in steps it kept; on one line) or
``demo: FAILED <reason>``; the exit status says the same. It shares every step with the e2e
suite (e2e/install.py, e2e/elasticjob.py, e2e/trainlog.py).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from e2e.cluster.api import WaitTimeoutError
from e2e.elasticjob import RUNNING_STEPS, Elastra, JobRun, example_job
from e2e.install import (
    Setup,
    checkpoint_storage,
    helm_install,
    helm_uninstall,
    restricted_namespace,
)
from e2e.kube import KubeError
from e2e.target import EXTERNAL_ENV, target_cluster
from e2e.trainlog import (
    StepRecord,
    TrainLogError,
    check_contiguous,
    check_data_order,
    check_resumes,
    resumes,
    world_spans,
)

from elastra.controller.decide.observe import parse_time

STEPS_PER_WORLD = 3


class DemoError(Exception):
    """A step of the demo did not happen; the message says which and what was seen."""


_NEVER = datetime.min.replace(tzinfo=UTC)


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


def run_demo(elastra: Elastra, *, steps_per_world: int) -> str:
    """Train, shrink, grow, verify; returns the summary (without the ``demo: OK`` prefix)."""
    kube, setup, job = elastra.kube, elastra.setup, elastra.job
    started = time.monotonic()
    say("applying examples/cpu-tiny.yaml (3 workers; the first pods import torch: minutes)")
    kube.apply(example_job(setup.job_namespace, steps=RUNNING_STEPS))
    version = job.wait_world(3, after=0)
    job.wait_trained(version, steps_per_world)
    say(f"world v{version} of 3 trains ({time.monotonic() - started:.0f}s)")
    scaled_at: list[float] = []
    for replicas in (2, 3):
        say(f"kubectl scale tj/{job.name} --replicas={replicas}")
        before = {p["metadata"]["name"] for p in job.pods()}
        scaled_at.append(time.time())  # wall clock: set against the step log's endedAt
        job.scale(replicas)
        version = job.wait_world(replicas, after=version)
        job.wait_trained(version, steps_per_world)
        say(f"world v{version} of {replicas} trains ({time.monotonic() - started:.0f}s)")
        for name, ready in _ready_since(job.pods(), before).items():
            say(f"new pod {name} Ready {max(ready - scaled_at[-1], 0):.0f}s after kubectl scale")
    records = job.step_log()
    check_contiguous(records)
    spans = world_spans(records)
    spec = kube.get("trainingjob", job.name, "-n", job.namespace)["spec"]
    check_data_order(
        records,
        seed=int(spec["training"]["seed"]),
        dataset_size=4096,
        global_batch_size=int(spec["training"]["globalBatchSize"]),
    )
    found = resumes(job.log_lines())
    check_resumes(found)
    restored = {r.step for r in found}
    if not {s.first_step for s in spans[1:]} <= restored:
        raise DemoError(f"a world started at a step no checkpoint was restored at: {spans}")
    worlds = "->".join(f"v{s.version}({s.size})" for s in spans)
    resumed = ",".join(str(s.first_step) for s in spans[1:])
    downtimes = ",".join(_downtime(records, s.first_step) for s in spans[1:])
    after_scale = ",".join(
        _since_scale(records[s.first_step].ended_at, scaled_at) for s in spans[1:]
    )
    formed = _formed_at(job.status())
    for span in spans[1:]:
        first = records[span.first_step]
        say(
            f"world v{span.version} of {span.size}: training stopped "
            f"{_downtime(records, span.first_step)} (end of the step it resumed from to the end "
            f"of its first step; rank 0's state from {first.state_from or '?'}); formed "
            f"{_since_scale(formed.get(span.version), scaled_at)} after kubectl scale, its "
            f"first step ended {_since_scale(first.ended_at, scaled_at)} after it"
        )
    return (
        f"worlds={worlds} steps={len(records)} resumed-from=[{resumed}] "
        f"downtime=[{downtimes}] scale-to-step=[{after_scale}] "
        f"goodput={_percent(records[-1].goodput)} data-order=static"
    )


def _downtime(records: Sequence[StepRecord], step: int) -> str:
    """The resize downtime rank 0 recorded on ``step`` (a world's first), as ``12.3s``."""
    seconds = records[step].downtime_s
    return "?" if seconds is None else f"{seconds:.1f}s"


def _timestamp(value: object) -> float | None:
    """An API timestamp (RFC 3339, whole seconds) as seconds since the epoch; None if absent."""
    moment = parse_time(value, _NEVER)
    return None if moment == _NEVER else moment.timestamp()


def _ready_since(pods: Sequence[dict[str, Any]], before: set[str]) -> dict[str, float]:
    """When each pod not in ``before`` turned Ready (wall clock, whole seconds as the API
    server keeps them): the part of a grow that is the new pod's start."""
    found = {}
    for pod in pods:
        conditions = (pod.get("status") or {}).get("conditions") or []
        ready = [c for c in conditions if c.get("type") == "Ready" and c.get("status") == "True"]
        when = _timestamp(ready[0].get("lastTransitionTime")) if ready else None
        if pod["metadata"]["name"] not in before and when is not None:
            found[pod["metadata"]["name"]] = when
    return found


def _formed_at(status: dict[str, Any]) -> dict[int, float]:
    """When the operator formed each world version (``status.resizes``, whole seconds): the
    grow waits for its new pod to be Ready here."""
    found = {}
    for resize in status.get("resizes") or []:
        when = _timestamp(resize.get("time"))
        if when is not None:
            found[int(resize["toVersion"])] = when
    return found


def _since_scale(when: float | None, scaled_at: Sequence[float]) -> str:
    """Seconds from the last ``kubectl scale`` before ``when`` (a step's end, a world's
    formation) to it, as ``4.2s`` (the cluster is this machine: one clock)."""
    if when is None:
        return "?"
    before = [t for t in scaled_at if t < when + 1]  # API timestamps: whole seconds
    return f"{max(when - before[-1], 0):.1f}s" if before else "?"


def _percent(fraction: float | None) -> str:
    """The goodput rank 0 recorded on the last step, as ``87%``."""
    return "?" if fraction is None else f"{fraction * 100:.0f}%"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.demo",
        description="Elastra end to end: local cluster with a real node, Helm install, "
        "cpu-tiny trained, scaled 3->2->3, checked; ends with one 'demo: OK|FAILED' line. "
        f"{EXTERNAL_ENV}=<kubeconfig> uses that cluster instead of starting one.",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the cluster, Elastra and the job running at the end (to look around)",
    )
    parser.add_argument(
        "--steps-per-world",
        type=int,
        default=STEPS_PER_WORLD,
        help="steps each world must train before the next resize (default %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.steps_per_world < 1:
        parser.error("--steps-per-world must be at least 1")
    summary = ""
    try:
        say("starting the cluster (builds the toolchain and images when missing)")
        with target_cluster(keep=args.keep) as target, contextlib.ExitStack() as stack:
            kube = target.kube
            setup = Setup(volume=target.volume("cpu-tiny"))
            job = JobRun(kube, setup.job_namespace, "cpu-tiny", operator=setup.operator)
            elastra = Elastra(kube, setup, job)
            if not args.keep:
                stack.callback(_cleanup, elastra)
            say(f"installing Elastra with Helm into {setup.operator_namespace} (restricted)")
            for namespace in (setup.operator_namespace, setup.job_namespace):
                restricted_namespace(kube, namespace)
            checkpoint_storage(kube, setup)
            helm_install(kube, setup)
            summary = run_demo(elastra, steps_per_world=args.steps_per_world)
            if args.keep:
                where = target.local_root / "env" if target.local_root else "your kubeconfig"
                say(f"left running (--keep): . {where}; kubectl get tj -A")
    except (DemoError, TrainLogError, KubeError, WaitTimeoutError, OSError) as err:
        print(f"demo: FAILED {_one_line(err)}", flush=True)
        return 1
    print(f"demo: OK {summary}", flush=True)
    return 0


def _cleanup(elastra: Elastra) -> None:
    say("cleaning up: job, release, namespaces")
    for step in (
        lambda: elastra.job.delete(timeout=240),
        lambda: helm_uninstall(elastra.kube, elastra.setup),
        lambda: elastra.kube.kubectl(
            "delete", "namespace", elastra.setup.job_namespace, elastra.setup.operator_namespace
        ),
        lambda: elastra.kube.kubectl("delete", "pv", elastra.setup.volume_name),
        lambda: shutil.rmtree(elastra.setup.volume.host) if elastra.setup.volume else None,
    ):
        with contextlib.suppress(KubeError, WaitTimeoutError, OSError):
            step()


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:600] or type(err).__name__


if __name__ == "__main__":
    sys.exit(main())
