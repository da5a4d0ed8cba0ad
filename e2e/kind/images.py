"""Elastra's images into the nodes of a kind cluster that run pods, unpacked, blobs dropped.

``python -m e2e.kind.images [--name N] [--from docker] worker operator``

``--from docker`` loads the images the Dockerfiles built (e2e/images/docker.py, in the docker
daemon kind runs on: ``docker save`` streamed into each node) instead of the offline builder's.

Why not `kind load image-archive`: it imports an image into every node and keeps both the
layer blobs and the unpacked snapshots. The worker image is a 5.6 GiB torch layer, so for one
control plane and three workers that is about 4 x 11 GiB, more than these machines' free disk.
Pods never run on a multi-node kind cluster's control plane (kind keeps its NoSchedule taint),
so the images go only to the nodes that run pods, and once an image is unpacked its layer
blobs are removed: containers start from the snapshots (the node image's preloaded images are
stored the same way). Per worker node that is 5.6 GiB instead of 11. The import itself is what
kind does (``ctr images import`` in the node, with the node's snapshotter), so the same code
serves kind's published node images.

Three worker nodes still held three unpacked copies (17 GiB), and a CI run once stopped at "no
space left on device" in the third. So after each node's import, the files of its unpacked
layers become hard links to the first node's (e2e/kind/hardlinks.py): a later node's copy
costs disk only while it is unpacked. That needs the nodes' /var volumes on this machine's
disk, under one mount, and the overlayfs snapshotter; elsewhere (a docker daemon in a VM) each
node keeps its own copy, as before. (The real node's store holds the same layers too, but
docker bind-mounts its data-root onto itself, and no hard link crosses a mount point.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from e2e.images import unpacked
from e2e.images.archive import write_archive
from e2e.images.build import BUILDERS, OPERATOR_TAG, WORKER_TAG, Image, drop_layer_blobs
from e2e.kind.cluster import DEFAULT_NAME, Env, environment, kind_binary, say
from e2e.kind.hardlinks import Linked, link_identical

ROLE_LABEL = "io.x-k8s.kind.role"
TAGS = {"worker": WORKER_TAG, "operator": OPERATOR_TAG}
"""The Dockerfiles' images are tagged as the offline ones (e2e/images/docker.py)."""
SNAPSHOTTER = re.compile(r'^\s*snapshotter\s*=\s*"([^"]+)"', re.MULTILINE)


def pod_nodes(env: Env, kind: str, name: str) -> list[str]:
    """The node containers pods run on: the workers, or the only node of a one-node cluster."""
    nodes = env.run(
        [kind, "get", "nodes", "--name", name], capture_output=True, check=True
    ).stdout.split()
    if not nodes:
        raise SystemExit(f"kind-images: cluster {name!r} has no nodes (is it up?)")
    roles = {
        node: env.docker("inspect", "--format", f'{{{{index .Config.Labels "{ROLE_LABEL}"}}}}',
                         node).stdout.strip()
        for node in nodes
    }  # fmt: skip
    return nodes_for_pods(roles)


def nodes_for_pods(roles: dict[str, str]) -> list[str]:
    """Node -> kind role: the workers, or every node when there is none (one node untainted)."""
    workers = sorted(node for node, role in roles.items() if role == "worker")
    return workers or sorted(roles)


def snapshotter_of(config_dump: str) -> str:
    """The CRI's snapshotter in `containerd config dump` (containerd's default: overlayfs)."""
    found = SNAPSHOTTER.search(config_dump)
    return found.group(1) if found else "overlayfs"


def snapshotter(env: Env, node: str) -> str:
    """The snapshotter the node's CRI unpacks with (what kubelet's containers start from)."""
    return snapshotter_of(env.docker("exec", node, "containerd", "config", "dump").stdout)


@dataclass(frozen=True)
class Loadable:
    """An image to stream into nodes: its tag, layer digests (lowest first), size and a writer
    of its docker-archive."""

    tag: str
    digests: list[str]
    size: int
    write: Callable[[IO[bytes]], None]

    @staticmethod
    def offline(image: Image) -> Loadable:
        """The offline builder's image (e2e/images/build.py), archived from its layer cache."""

        def write(dst: IO[bytes]) -> None:
            write_archive(dst, tag=image.tag, layers=image.layers, config=image.config)

        return Loadable(image.tag, image.digests, image.size, write)

    @staticmethod
    def from_docker(env: Env, tag: str) -> Loadable:
        """The image of that tag in the daemon kind runs on (the Dockerfiles' build), saved."""
        raw = env.docker("image", "inspect", "--format", "{{json .RootFS.Layers}} {{.Size}}", tag)
        if raw.returncode != 0:
            raise SystemExit(f"kind-images: {tag} is not in docker (make images-docker builds it)")
        layers, size = raw.stdout.split()

        def write(dst: IO[bytes]) -> None:
            save = subprocess.run(["docker", "save", tag], stdout=dst, env=env.vars, check=False)
            if save.returncode != 0:
                raise SystemExit(f"kind-images: docker save {tag} failed")

        return Loadable(tag, list(json.loads(layers)), int(size), write)


def load_into(env: Env, node: str, image: Loadable) -> str:
    """Stream the image into the node's containerd (namespace k8s.io), then drop its blobs;
    returns the snapshotter it was unpacked with."""
    unpacker = snapshotter(env, node)
    ctr = ["docker", "exec", "-i", node, "ctr", "--namespace=k8s.io"]
    argv = [*ctr, "images", "import", "--all-platforms", "--digests",
            f"--snapshotter={unpacker}", "-"]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            env=env.vars)  # fmt: skip
    assert proc.stdin is not None
    try:
        image.write(proc.stdin)
    finally:
        proc.stdin.close()
    if proc.wait() != 0:
        raise SystemExit(f"kind-images: importing {image.tag} into node {node} failed")
    drop_layer_blobs(ctr, image.digests, env=env.vars)
    listed = env.docker("exec", node, "ctr", "--namespace=k8s.io", "images", "ls", "-q")
    if image.tag not in listed.stdout.split():
        raise SystemExit(f"kind-images: {image.tag} is not listed in node {node} after import")
    return unpacker


def var_on_host(env: Env, node: str) -> Path | None:
    """Where the node's /var volume lies on this machine, or None (a daemon elsewhere)."""
    raw = env.docker("inspect", "--format", "{{json .Mounts}}", node).stdout or "[]"
    for mount in json.loads(raw):
        if mount.get("Destination") == "/var" and Path(mount.get("Source", "")).is_dir():
            return Path(mount["Source"])
    return None


def layer_dirs(env: Env, node: str, image: Loadable, snapshotter: str) -> list[Path] | None:
    """The unpacked layers of `image` in the node, lowest first, as paths on this machine;
    None where they are not reachable from here."""
    var = var_on_host(env, node)
    if var is None or snapshotter != "overlayfs":
        return None
    ctr = ["docker", "exec", node, "ctr", "--namespace=k8s.io"]
    try:
        inside = unpacked.layer_dirs(ctr, image.digests, env=env.vars)
    except (subprocess.CalledProcessError, ValueError) as err:
        say(f"{node}: where {image.tag}'s layers lie is unknown ({err}); they stay copies")
        return None
    return [var / Path(d).relative_to("/var") for d in inside]


def share_layers(reference: list[Path], node: str, dirs: list[Path], *, of: str) -> None:
    """Hard-link the node's unpacked layers to the reference's (e2e/kind/hardlinks.py)."""
    linked = Linked()
    try:
        for theirs, mine in zip(reference, dirs, strict=True):
            linked += link_identical(theirs, mine)
    except OSError as err:  # EXDEV: the two lie on different filesystems or mounts
        say(f"{node}: its layers stay a copy of their own ({err})")
    say(f"{node}: {linked.files} files ({linked.bytes / 2**20:.0f} MiB) hard-linked to {of}")


def load(name: str, images: list[str], *, kind: str, source: str = "offline") -> None:
    env = environment(start=False)
    kind = kind_binary(kind)
    nodes = pod_nodes(env, kind, name)
    for image_name in images:
        if source == "docker":
            if image_name not in TAGS:
                raise SystemExit(f"kind-images: no Dockerfile builds {image_name!r}")
            image = Loadable.from_docker(env, TAGS[image_name])
        else:
            image = Loadable.offline(BUILDERS[image_name]())
        first: tuple[str, list[Path]] | None = None
        for node in nodes:
            started = time.monotonic()
            say(f"{image.tag} ({image.size / 2**20:.0f} MiB) into {node} ...")
            snapshotter = load_into(env, node, image)
            dirs = layer_dirs(env, node, image, snapshotter)
            if first is not None and dirs is not None:
                share_layers(first[1], node, dirs, of=f"{first[0]}'s")
            elif dirs is not None:
                first = (node, dirs)
            say(f"{image.tag} into {node}: {time.monotonic() - started:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.kind.images",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("images", nargs="+", choices=sorted(BUILDERS))
    parser.add_argument("--name", default=os.environ.get("KIND_CLUSTER", DEFAULT_NAME))
    parser.add_argument("--kind", default="", help="kind binary (default: make kind-image's)")
    parser.add_argument(
        "--from",
        dest="source",
        choices=["offline", "docker"],
        default="offline",
        help="the offline builder's images, or the Dockerfiles' in docker",
    )
    args = parser.parse_args(argv)
    load(args.name, args.images, kind=args.kind, source=args.source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
