"""Real pods on a real node: the locally built image runs, gets an IP, and pods talk over TCP.

Why: the e2e suite and `make demo` rely on `python -m e2e.cluster up --real-node` (containerd,
CNI, kubelet, kube-proxy on this machine, images built without a registry). This test starts
its own cluster with a real node (one per machine; a real-node cluster a person started is
borrowed instead, in a namespace of its own), runs pods from the locally built
`python` image (Debian + python3, e2e/images) and checks pod IPs, pod-to-pod TCP and a pod
reaching the API server through the `kubernetes` Service (kube-proxy's translation), and a
pod found by its DNS name under a headless Service (the node's CoreDNS), as the operator's
workers find rank 0.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.cluster import ClusterDirs, down, is_up, up
from e2e.cluster.api import wait_for
from e2e.cluster.components import REAL_NODE_POD_CIDR
from e2e.cluster.state import State
from e2e.images.build import PYTHON_TAG
from e2e.node.node import NODE_LABEL, claim_holder

# Cold machine: apt packages + debootstrap of the python image (~6 min on 2 busy cores), and up
# to ELASTRA_REAL_NODE_WAIT (600 s) while another test run holds the machine's one real node.
pytestmark = pytest.mark.timeout(1800)

SERVER = """
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen()
while True:
    c, addr = s.accept()
    c.sendall(b"pong " + socket.gethostname().encode() + b" " + c.recv(64))
    c.close()
"""

CLIENT = """
import socket, sys
for attempt in range(int(sys.argv[2]) if len(sys.argv) > 2 else 50):
    try:
        c = socket.create_connection((sys.argv[1], 8080), timeout=2)
        break
    except OSError as err:
        import time; time.sleep(0.2)
else:
    raise SystemExit(f"cannot connect: {err}")
c.sendall(b"ping")
reply = c.recv(128).decode()
open("/dev/termination-log", "w").write(reply)
print(reply)
"""

API = """
import json, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
req = urllib.request.Request("https://kubernetes.default.svc:443/version")
req.add_header("Authorization", "Bearer " + open(sa + "/token").read())
req.full_url = "https://" + __import__("os").environ["KUBERNETES_SERVICE_HOST"] + ":443/version"
ctx.check_hostname = False
body = json.load(urllib.request.urlopen(req, context=ctx, timeout=10))
open("/dev/termination-log", "w").write(body["gitVersion"])
"""


class NodeKubectl:
    def __init__(self, layout: ClusterDirs, bindir: Path, namespace: str) -> None:
        self.kubeconfig = layout.kubeconfig
        self.kubectl_bin = bindir / "kubectl"
        self.namespace = namespace

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        cmd = [
            str(self.kubectl_bin),
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={self.namespace}",
            *args,
        ]
        out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    def pod(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.kubectl("get", "pod", name, "-o", "json"))
        return result

    def run_pod(
        self, name: str, code: str, *args: str, restart: str = "Never", **spec: str
    ) -> None:
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {
                **spec,
                "nodeSelector": {NODE_LABEL: "true"},
                "restartPolicy": restart,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": PYTHON_TAG,
                        "imagePullPolicy": "Never",
                        "command": ["python3", "-c", code, *args],
                    }
                ],
            },
        }
        self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

    def wait_phase(self, name: str, phases: set[str], timeout: float = 120) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            pod = self.pod(name)
            return pod if pod.get("status", {}).get("phase") in phases else None

        return wait_for(
            f"pod {name} to reach {sorted(phases)}",
            probe,
            timeout=timeout,
            interval=0.5,
            hint=lambda: json.dumps(self.pod(name).get("status", {}))[:1500],
        )


def _message(pod: dict[str, Any]) -> str:
    state = pod["status"]["containerStatuses"][0]["state"]
    return str((state.get("terminated") or {}).get("message", ""))


def _borrowable() -> ClusterDirs | None:
    """A running cluster with the machine's real node that a person started (owner "")."""
    holder = claim_holder()
    if holder is None:
        return None
    layout = ClusterDirs(holder)
    state = State.load(layout)
    if state is None or state.owner or not state.real_node or not is_up(layout):
        return None
    return layout


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeKubectl]:
    borrowed = _borrowable()
    layout = borrowed or ClusterDirs(tmp_path_factory.mktemp("real-node-cluster"))
    if borrowed is None:
        up(layout, fleet=None, owner=f"pid:{os.getpid()}", real_node=True, images=("python",))
    else:
        up(layout, fleet=None, real_node=True, images=("python",))  # imports the image only
    state = State.load(layout)
    assert state is not None
    namespace = f"real-node-{uuid.uuid4().hex[:8]}"
    kube = NodeKubectl(layout, Path(state.bindir), namespace)
    try:
        kube.kubectl("create", "namespace", namespace)
        wait_for(
            "the namespace's default service account",
            lambda: "default" in kube.kubectl("get", "serviceaccounts", "-o", "name"),
            timeout=60,
        )
        yield kube
    finally:
        if borrowed is None:
            down(layout)
        else:
            kube.kubectl("delete", "namespace", namespace, "--wait=false")


def test_pod_runs_with_an_ip(kube: NodeKubectl) -> None:
    started = time.monotonic()
    kube.run_pod("sleeper", "import time; time.sleep(3600)")
    pod = kube.wait_phase("sleeper", {"Running"})
    ip = ipaddress.ip_address(pod["status"]["podIP"])
    assert ip in ipaddress.ip_network(REAL_NODE_POD_CIDR), pod["status"]
    assert pod["spec"]["nodeName"].startswith("real-")
    print(f"pod Running with IP {ip} after {time.monotonic() - started:.1f}s")


def test_two_pods_reach_each_other_over_tcp(kube: NodeKubectl) -> None:
    kube.run_pod("server", SERVER)
    server = kube.wait_phase("server", {"Running"})
    kube.run_pod("client", CLIENT, server["status"]["podIP"])
    client = kube.wait_phase("client", {"Succeeded", "Failed"})
    assert client["status"]["phase"] == "Succeeded", client["status"]
    assert client["status"]["podIP"] != server["status"]["podIP"]
    assert _message(client) == "pong server ping"


def test_pod_reaches_the_api_server_through_its_service(kube: NodeKubectl) -> None:
    kube.run_pod("apicheck", API)
    pod = kube.wait_phase("apicheck", {"Succeeded", "Failed"})
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert _message(pod).startswith("v1.")


def test_pod_finds_another_by_its_dns_name_before_it_is_ready(kube: NodeKubectl) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "peers"},
        "spec": {
            "clusterIP": "None",
            "selector": {"app": "named"},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "pong", "port": 8080}],
        },
    }
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(service))
    started = time.monotonic()
    kube.run_pod("named", SERVER, hostname="named", subdomain="peers")
    name = f"named.peers.{kube.namespace}.svc"
    kube.run_pod("resolver", CLIENT, name, "300")
    pod = kube.wait_phase("resolver", {"Succeeded", "Failed"})
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert _message(pod) == "pong named ping"
    print(f"{name} answered {time.monotonic() - started:.1f}s after both pods were created")
