"""Boot the kind node image with runc alone and bring up a one-node cluster in it.

``python -m e2e.kind.boottest`` (root; after ``make kind-image``). Prints each step's time;
exit 0 when the node became Ready and every kube-system pod ran.

Why: kind needs a docker daemon, which a machine may not have or may not be allowed to start
(it adds bridges; here a CI run owned the network). This checks everything in the node image
that does not depend on docker: the entrypoint, systemd, containerd with the preloaded images,
the runc wrapper (kube-proxy is a privileged pod), kubeadm init with a kind-like config, the
node's pod network and CoreDNS. The container gets what ``docker run --privileged
--cgroupns=private`` would give it, in namespaces of its own; its network namespace has a veth
pair of its own and no link out of it, so no packet can leave. The runc container, its cgroup
and the unpacked bundle are removed at the end, also on failure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from e2e.kind import nodeimage

NAME = "elastra-kind-boottest"
CGROUP = f"/{NAME}"
NODE_IP = "198.18.254.2"
"""Inside the container's own network namespace only (a veth pair with both ends there). Not
a private (RFC 1918) address: the node image rejects those outside its docker network, and
this container has none (198.18.0.0/15 is the benchmarking range)."""
CAPS = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
]
"""What --privileged asks for; runcwrap removes the ones this machine's root lacks."""


def say(msg: str) -> None:
    print(f"kind-boottest: {msg}", file=sys.stderr, flush=True)


def spec(base: dict[str, object]) -> dict[str, object]:
    """`runc spec`'s output turned into a privileged, cgroupns-private systemd container."""
    caps = ["CAP_" + c for c in CAPS]
    process = dict(base["process"])  # type: ignore[call-overload]
    process.update(
        terminal=False,
        args=["/usr/local/bin/entrypoint", "/sbin/init"],
        env=[
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "container=docker",
        ],
        capabilities={k: caps for k in ("bounding", "effective", "permitted")},
        noNewPrivileges=False,
    )
    process.pop("rlimits", None)
    tmpfs = ["nosuid", "nodev"]
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "mode=755"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": [*tmpfs, "mode=1777"],
        },
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "rw"]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["rw"]},
        {
            "destination": "/run",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": [*tmpfs, "mode=755"],
        },
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": [*tmpfs, "mode=1777"],
        },
    ]
    linux = dict(base["linux"])  # type: ignore[call-overload]
    linux.update(
        namespaces=[{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")],
        maskedPaths=[],
        readonlyPaths=[],
        resources={"devices": [{"allow": True, "access": "rwm"}]},
        cgroupsPath=CGROUP,
    )
    return {
        **base,
        "process": process,
        "root": {"path": "rootfs", "readonly": False},
        "hostname": NAME,
        "mounts": mounts,
        "linux": linux,
    }


KUBEADM_CONFIG = f"""\
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: {{version}}
clusterName: boottest
controlPlaneEndpoint: "{NAME}:6443"
networking:
  podSubnet: "10.244.0.0/16"
  serviceSubnet: "10.96.0.0/16"
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: "{NODE_IP}"
  bindPort: 6443
nodeRegistration:
  criSocket: "unix:///run/containerd/containerd.sock"
  kubeletExtraArgs:
    - name: "node-ip"
      value: "{NODE_IP}"
skipPhases: ["preflight"]
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
cgroupRoot: /kubelet
failSwapOn: false
imageGCHighThresholdPercent: 100
evictionHard: {{{{nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}}}}
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
conntrack:
  maxPerCore: 0
"""
"""Like the config kind writes (same cgroup settings, preflight skipped), for one node.
kube-proxy must not set nf_conntrack_max (a global sysctl; kind sets maxPerCore 0 too):
without it kube-proxy fails with "open /proc/sys/net/netfilter/nf_conntrack_max: permission
denied"."""


class Container:
    def __init__(self, runcwrap: Path, state: Path) -> None:
        self.runcwrap = runcwrap
        self.state = state

    def runc(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.runcwrap), "--root", str(self.state), *args],
            capture_output=True,
            text=True,
            check=check,
        )

    def sh(self, script: str, *, timeout: float = 300) -> str:
        out = subprocess.run(
            [str(self.runcwrap), "--root", str(self.state), "exec", NAME, "sh", "-c", script],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{script!r} failed ({out.returncode}): {out.stderr[-2000:]}")
        return out.stdout


def remove_cgroups() -> list[str]:
    """rmdir the container's cgroup in every hierarchy, deepest first; what could not go."""
    left = []
    for top in Path("/sys/fs/cgroup").glob(f"*{CGROUP}"):
        for sub in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
            if sub.is_dir():
                sub.rmdir()
        try:
            top.rmdir()
        except OSError as err:
            left.append(f"{top}: {err}")
    return left


def run(work: Path, runcwrap: Path) -> None:
    image = nodeimage.read_description()
    version = json.loads(image.config)["config"]["Labels"]["dev.elastra.kind-node.kubernetes"]
    bundle, state = work / "bundle", work / "state"
    (bundle / "rootfs").mkdir(parents=True)
    t0 = time.monotonic()
    for layer in image.layers:
        subprocess.run(
            ["tar", "-C", str(bundle / "rootfs"), "--numeric-owner", "-xf", str(layer.path)],
            check=True,
        )
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    config = bundle / "config.json"
    config.write_text(json.dumps(spec(json.loads(config.read_text()))))
    say(f"bundle unpacked in {time.monotonic() - t0:.0f}s")
    c = Container(runcwrap, state)
    log = (work / "console.log").open("wb")
    t0 = time.monotonic()
    subprocess.run(
        [str(runcwrap), "--root", str(state), "run", "-d", "--bundle", str(bundle), NAME],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        check=True,
    )
    status = ""
    for _ in range(120):  # systemd answers "starting" until its boot jobs are done
        status = c.sh("systemctl is-system-running || true").strip()
        if status in ("running", "degraded"):
            break
        time.sleep(0.5)
    say(f"container up in {time.monotonic() - t0:.1f}s: systemd {status}")
    # What docker gives a node and runc's defaults do not.
    c.sh(
        f"ip link add eth0 type veth peer name eth0peer && ip addr add {NODE_IP}/24 dev eth0"
        " && ip link set eth0 up && ip link set eth0peer up"
        " && ip route add default via 198.18.254.1 dev eth0 onlink"
        " && mknod -m 644 /dev/kmsg c 1 11"
        " && echo 'nameserver 198.18.254.1' > /etc/resolv.conf"
        f" && echo '{NODE_IP} {NAME}' >> /etc/hosts"
    )
    c.sh(f"cat > /kind/kubeadm.conf <<'EOF'\n{KUBEADM_CONFIG.format(version=version)}EOF")
    t0 = time.monotonic()
    c.sh(
        "kubeadm init --config=/kind/kubeadm.conf --skip-token-print >/kind/kubeadm-init.log 2>&1 "
        "|| { tail -20 /kind/kubeadm-init.log; exit 1; }"
    )
    say(f"kubeadm init: {time.monotonic() - t0:.0f}s")
    k = "kubectl --kubeconfig=/etc/kubernetes/admin.conf"
    c.sh(
        "sed 's#{{ .PodSubnet }}#10.244.0.0/16#' /kind/manifests/default-cni.yaml"
        f" | {k} apply -f -"
        f" && {k} apply -f /kind/manifests/default-storage.yaml"
        f" && {k} taint nodes --all node-role.kubernetes.io/control-plane-"
    )
    c.sh(f"{k} wait --for=condition=Ready node --all --timeout=60s")
    say(f"node Ready {time.monotonic() - t0:.0f}s after kubeadm init began")
    c.sh(f"{k} -n kube-system wait --for=condition=Ready pod --all --timeout=60s")
    say("kube-system:\n" + c.sh(f"{k} get pods -A -o wide"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.kind.boottest")
    parser.add_argument("--keep", action="store_true", help="leave the container running")
    args = parser.parse_args(argv)
    runcwrap = (
        Path(
            subprocess.run(
                [str(Path(__file__).with_name("build.sh")), "--print-bindir"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        / "runcwrap"
    )
    work = Path(tempfile.mkdtemp(prefix="boottest-", dir=nodeimage.description_path().parent))
    c = Container(runcwrap, work / "state")
    started = time.monotonic()
    ok = False
    try:
        run(work, runcwrap)
        ok = True
    except (RuntimeError, subprocess.SubprocessError) as err:
        say(f"FAILED: {err}")
    finally:
        if not args.keep:
            c.runc("kill", NAME, "KILL", check=False)
            time.sleep(2)
            c.runc("delete", "-f", NAME, check=False)
            left = remove_cgroups()
            shutil.rmtree(work, ignore_errors=True)
            if left:
                say(f"left behind: {left}")
    say(f"{'passed' if ok else 'failed'} in {time.monotonic() - started:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
