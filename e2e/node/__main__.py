"""`python -m e2e.node gloo-check`: two worker pods on the real node run a gloo all_reduce.

Why: the quickest proof that the locally built worker image (torch + elastra_worker) runs on
the real node and that pods reach each other the way DDP needs (TCPStore + gloo over pod IPs).
Needs a cluster started with `python -m e2e.cluster up --real-node --images worker`
(ELASTRA_CLUSTER_DIR picks it). Prints one line per rank and exits 0 when both agree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from e2e.cluster.state import ClusterDirs, State, default_layout
from e2e.images.build import WORKER_TAG

from .node import NODE_LABEL

GLOO = """
import datetime, sys, time
import torch, torch.distributed as dist
import elastra_worker
rank, master = int(sys.argv[1]), sys.argv[2]
started = time.time()
dist.init_process_group("gloo", init_method=f"tcp://{master}:29500", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=120))
x = torch.tensor([rank + 1.0])
dist.all_reduce(x)
msg = f"rank {rank}: torch {torch.__version__} all_reduce={x.item()} ({time.time() - started:.1f}s)"
print(msg)
open("/dev/termination-log", "w").write(msg)
dist.destroy_process_group()
"""


def _pod(name: str, rank: int, master: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "elastra-gloo-check"}},
            "spec": {
                "nodeSelector": {NODE_LABEL: "true"},
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "worker",
                        "image": WORKER_TAG,
                        "imagePullPolicy": "Never",
                        "command": ["python3", "-c", GLOO, str(rank), master],
                    }
                ],
            },
        }
    )


def gloo_check(layout: ClusterDirs, timeout: float) -> int:
    state = State.load(layout)
    if state is None or not state.real_node:
        print(f"node: error: no cluster with a real node in {layout.root}", file=sys.stderr)
        return 1
    kubectl = [str(Path(state.bindir) / "kubectl"), f"--kubeconfig={layout.kubeconfig}"]

    def run(*args: str, stdin: str | None = None) -> str:
        out = subprocess.run(
            [*kubectl, *args], input=stdin, capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            raise SystemExit(f"node: error: kubectl {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    names = ["gloo-check-0", "gloo-check-1"]
    subprocess.run([*kubectl, "delete", "pod", *names, "--ignore-not-found", "--wait"], check=False)
    started = time.monotonic()
    run("apply", "-f", "-", stdin=_pod(names[0], 0, "0.0.0.0"))  # rank 0 hosts the TCPStore
    ip = ""
    while not ip and time.monotonic() - started < timeout:
        ip = run("get", "pod", names[0], "-o", "jsonpath={.status.podIP}")
        time.sleep(0.5)
    run("apply", "-f", "-", stdin=_pod(names[1], 1, ip))
    phases: list[str] = []
    while time.monotonic() - started < timeout:
        phases = [run("get", "pod", n, "-o", "jsonpath={.status.phase}") for n in names]
        if all(p in ("Succeeded", "Failed") for p in phases):
            break
        time.sleep(1)
    for name in names:
        print(f"--- {name}\n" + run("logs", name).strip()[-2000:])
    elapsed = time.monotonic() - started
    ok = phases == ["Succeeded", "Succeeded"]
    print(f"gloo-check: {'OK' if ok else 'FAILED'} phases={phases} in {elapsed:.0f}s")
    run("delete", "pod", *names, "--ignore-not-found")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.node")
    parser.add_argument("command", choices=["gloo-check"])
    parser.add_argument("--dir", type=Path, help="cluster folder (default: $ELASTRA_CLUSTER_DIR)")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    layout = ClusterDirs(args.dir.resolve()) if args.dir else default_layout()
    return gloo_check(layout, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
