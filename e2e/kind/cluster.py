"""A kind cluster on this machine, from nothing to Ready nodes and back to nothing.

``python -m e2e.kind.cluster up [--config e2e/kind-config.yaml] [--name N] [--kubeconfig F]``
``python -m e2e.kind.cluster down [--name N]``   (and the daemon it started, once no
                                                 other kind cluster runs on it)
``python -m e2e.kind.cluster leftovers``         (exit 1 and list them when anything is left)

Why a module: `kind create cluster` is one command only where docker runs and kind's node
image can be pulled. Here the node image is ours (``make kind-image``), docker is a private
daemon (e2e/kind/dockerd.py) unless the user has one (``ELASTRA_KIND_DOCKERD=0`` forces
theirs, ``=1`` forces ours; by default ours when no daemon answers), and leaving the machine
as it was takes more than `kind delete cluster`: kind leaves its docker network (a bridge)
behind, and docker creates ``/lib/modules`` on a host that has none (kind mounts it into
every node). ``down`` removes what ``up`` made and ``leftovers`` checks it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from e2e.kind import dockerd, nodeimage
from e2e.target import SHARED_ENV

REPO = Path(__file__).resolve().parents[2]
DEFAULT_NAME = "elastra-e2e"
LIB_MODULES = Path("/lib/modules")
SHARED_PV_PATH = "/tmp/hostpath_pv"
"""Where every node mounts one host folder (``<cache>/kind/volumes/<cluster>``): the e2e suite's
static checkpoint volumes live there (``env`` prints it as ELASTRA_E2E_SHARED_VOLUMES), and so
do the claims of the controller-manager's host-path provisioner (the local node image's
default StorageClass puts each claim's folder here). A job's workers on different nodes, or a
worker rescheduled after its node was lost, see the same checkpoints."""


def with_shared_volumes(config: Path, shared: Path, out: Path) -> Path:
    """A copy of a kind config in which every node mounts `shared` at SHARED_PV_PATH."""
    doc = yaml.safe_load(config.read_text()) or {}
    nodes = doc.get("nodes") or [{"role": "control-plane"}]
    for node in nodes:
        mounts = node.setdefault("extraMounts", [])
        if not any(m.get("containerPath") == SHARED_PV_PATH for m in mounts):
            mounts.append({"hostPath": str(shared), "containerPath": SHARED_PV_PATH})
    doc["nodes"] = nodes
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def say(msg: str) -> None:
    print(f"kind-cluster: {msg}", file=sys.stderr, flush=True)


def state_file(name: str) -> Path:
    """What `up` of cluster `name` changed on this machine, so that its `down` undoes exactly
    that. One file per cluster: with one for all, a second cluster's `up` (two kind chapters on
    one daemon) overwrote the first's, whose `env` then named the second's shared folder and
    whose `down` deleted it under the second's running suite."""
    return dockerd.DockerdDirs.default().data.parent / f"cluster-state-{name}.json"


def read_state(name: str) -> dict[str, object]:
    try:
        raw = json.loads(state_file(name).read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def write_state(name: str, state: dict[str, object]) -> None:
    path = state_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state) + "\n")


def bindir() -> Path:
    out = subprocess.run(
        [str(REPO / "e2e/kind/build.sh"), "--print-bindir"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


@dataclass
class Env:
    """The environment kind and docker run in (DOCKER_HOST and PATH when the daemon is ours)."""

    vars: dict[str, str]
    ours: bool

    def run(
        self, argv: list[str], *, check: bool, **kw: object
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # type: ignore[call-overload,no-any-return]
            argv, env=self.vars, text=True, check=check, **kw
        )

    def docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(["docker", *args], capture_output=True, check=False)


def their_docker_answers() -> bool:
    try:
        probe = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            check=False,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def environment(*, start: bool) -> Env:
    """Ours or theirs (see the module doc); with start, our daemon is started when needed."""
    choice = os.environ.get("ELASTRA_KIND_DOCKERD", "")
    layout = dockerd.DockerdDirs.default()
    ours = choice == "1" or (choice != "0" and dockerd.read_pid(layout) is not None)
    if not ours and choice != "0" and not their_docker_answers():
        ours = True
    if not ours:
        return Env(dict(os.environ), ours=False)
    if start:
        dockerd.start(
            layout,
            bindir() / "runcwrap",
            pool=os.environ.get("ELASTRA_KIND_POOL", dockerd.DEFAULT_POOL),
        )
    return Env({**os.environ, **dockerd.env(layout)}, ours=True)


def ensure_node_image(env: Env) -> str:
    """The node image's tag, loaded into docker (streamed from the layer cache when missing)."""
    image = nodeimage.read_description()
    config_id = "sha256:" + hashlib.sha256(image.config).hexdigest()
    have = env.docker("image", "inspect", "--format", "{{.Id}}", image.tag)
    if have.returncode == 0 and have.stdout.strip() == config_id:
        say(f"node image {image.tag} already loaded")
        return image.tag
    started = time.monotonic()
    say(f"loading {image.tag} into docker ...")
    save = subprocess.Popen(
        [sys.executable, "-m", "e2e.kind.nodeimage", "save"], stdout=subprocess.PIPE, cwd=REPO
    )
    load = env.run(["docker", "load"], stdin=save.stdout, capture_output=True, check=False)
    if save.stdout is not None:
        save.stdout.close()
    if save.wait() != 0 or load.returncode != 0:
        raise SystemExit(f"kind-cluster: docker load failed: {load.stderr.strip()}")
    say(f"loaded in {time.monotonic() - started:.0f}s")
    if env.ours:
        # The build it replaced is left untagged (~1 GB each); in our daemon nothing else is.
        env.docker("image", "prune", "--force")
    return image.tag


def kind_binary(kind: str) -> str:
    """kind itself: ours (make kind-image) unless one is named."""
    return kind or str(bindir() / "kind")


def up(
    name: str, config: Path, kubeconfig: Path | None, wait: str, *, image: str, kind: str
) -> None:
    """image: "local" (make kind-image), "" (kind's published default) or a tag."""
    started = time.monotonic()
    env = environment(start=image == "local")
    state = read_state(name)
    state["ours"] = env.ours
    if not LIB_MODULES.exists():
        # kind bind-mounts /lib/modules into every node; docker would create it on the host.
        LIB_MODULES.mkdir(parents=True)
        state["created_lib_modules"] = True
    shared = dockerd.DockerdDirs.default().data.parent / "volumes" / name
    shared.mkdir(parents=True, exist_ok=True)
    state["shared"] = str(shared)
    config = with_shared_volumes(config, shared, shared.parent / f"{name}-kind-config.yaml")
    write_state(name, state)
    kind = kind_binary(kind)
    argv = [kind, "create", "cluster", "--name", name, "--config", str(config), "--wait", wait]
    if image:
        argv += ["--image", ensure_node_image(env) if image == "local" else image]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    say("$ " + " ".join(argv))
    t0 = time.monotonic()
    env.run(argv, check=True)
    say(f"kind create cluster: {time.monotonic() - t0:.0f}s")
    nodes = env.run(
        [kind, "get", "nodes", "--name", name], capture_output=True, check=True
    ).stdout.split()
    say(f"cluster {name} up with {len(nodes)} node(s) in {time.monotonic() - started:.0f}s")


def other_clusters(env: Env, kind: str, name: str) -> list[str]:
    """The kind clusters on the daemon besides `name` (kind prints one name a line)."""
    listed = env.run([kind, "get", "clusters"], capture_output=True, check=False)
    found = listed.stdout.split() if listed.returncode == 0 else []
    return [cluster for cluster in found if cluster != name]


def forget_the_daemon(env: Env) -> None:
    """What the last cluster leaves: kind's network (a bridge on the host), and in our daemon
    the node volumes (/var of each node, ~1 GB) of nodes kind did not remove, and the daemon."""
    if env.docker("network", "inspect", "kind").returncode == 0:
        rm = env.docker("network", "rm", "kind")
        say("removed docker network kind" if rm.returncode == 0 else rm.stderr.strip())
    if env.ours:
        env.docker("volume", "prune", "--force")
        dockerd.stop(dockerd.DockerdDirs.default())


def down(name: str, *, kind: str) -> None:
    state = read_state(name)
    env = environment(start=False)
    if env.ours and dockerd.read_pid(dockerd.DockerdDirs.default()) is None:
        say("our docker daemon is not running: nothing of kind's can be left in it")
    else:
        kind = kind_binary(kind)
        env.run([kind, "delete", "cluster", "--name", name], check=False)
        if others := other_clusters(env, kind, name):
            # Their nodes sit on kind's network, and stopping the daemon would kill them.
            say(f"kind cluster(s) {', '.join(others)} still run: the daemon and network stay")
        else:
            forget_the_daemon(env)
    shared = state.get("shared")
    if isinstance(shared, str):
        # The claims' data of this cluster, and the config that mounted it.
        shutil.rmtree(shared, ignore_errors=True)
        Path(f"{shared}-kind-config.yaml").unlink(missing_ok=True)
    if state.get("created_lib_modules") and LIB_MODULES.is_dir():
        try:
            LIB_MODULES.rmdir()
        except OSError as err:
            say(f"left {LIB_MODULES}: {err}")
    state_file(name).unlink(missing_ok=True)


def leftovers() -> list[str]:
    """Anything of a kind cluster or our daemon still on this machine."""
    found: list[str] = []
    layout = dockerd.DockerdDirs.default()
    pid = dockerd.read_pid(layout)
    if pid is not None:
        found.append(f"dockerd pid {pid}")
        env = Env({**os.environ, **dockerd.env(layout)}, ours=True)
        ps = env.docker("ps", "-aq")
        found += [f"container {c}" for c in ps.stdout.split()]
        nets = env.docker("network", "ls", "--format", "{{.Name}}")
        found += [
            f"network {n}" for n in nets.stdout.split() if n not in {"bridge", "host", "none"}
        ]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False)
    for line in links.stdout.splitlines():
        ifname = line.split(":")[1].strip().split("@")[0]
        if ifname.startswith(("br-", "docker0")):
            found.append(f"link {ifname}")
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False)
    found += [f"iptables {r}" for r in rules.stdout.splitlines() if "DOCKER" in r.upper()]
    mounts = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=False
    )
    found += [f"mount {m}" for m in mounts.stdout.split() if "kind" in m or "/docker" in m]
    if pid is None and layout.created.exists():
        found.append(f"paths our daemon created: {layout.created.read_text().strip()}")
    name = layout.cgroup_parent.lstrip("/")
    found += [f"cgroup {c}" for c in Path("/sys/fs/cgroup").glob(f"*/{name}")]
    states = layout.data.parent.glob("cluster-state-*.json")
    created = any(read_state(p.name[14:-5]).get("created_lib_modules") for p in states)
    if created and LIB_MODULES.exists():
        found.append(f"{LIB_MODULES} (created by up)")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.kind.cluster")
    parser.add_argument("command", choices=["up", "down", "leftovers", "env"])
    parser.add_argument("--image", default="local", help='"local", "" (published) or a tag')
    parser.add_argument("--kind", default="", help="kind binary (default: make kind-image's)")
    parser.add_argument("--name", default=os.environ.get("KIND_CLUSTER", DEFAULT_NAME))
    parser.add_argument("--config", type=Path, default=REPO / "e2e/kind-config.yaml")
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--wait", default="5m")
    args = parser.parse_args(argv)
    if args.command == "up":
        up(args.name, args.config, args.kubeconfig, args.wait, image=args.image, kind=args.kind)
    elif args.command == "down":
        down(args.name, kind=args.kind)
    elif args.command == "env":
        env = environment(start=False)
        if env.ours:
            for key, value in dockerd.env(dockerd.DockerdDirs.default()).items():
                print(f"export {key}={value}")
        shared = read_state(args.name).get("shared")
        if isinstance(shared, str):
            print(f"export {SHARED_ENV}={shared}:{SHARED_PV_PATH}")
    else:
        found = leftovers()
        for item in found:
            print(item)
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
