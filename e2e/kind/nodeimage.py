"""kind's node image, assembled offline from Debian packages and binaries built here.

Why: ``kind create cluster`` needs a node image, and kind's published one (and its own
``kind build node-image``) come from a registry that these machines cannot reach. A node image
is a file system with a few conventions that kind relies on (read from kind v0.33.0's source):

- ``/kind/version`` holds the Kubernetes version (kind picks its kubeadm config from it);
- ``/kind/manifests/default-cni.yaml`` and ``default-storage.yaml`` are applied by kind with
  kubectl at cluster creation (the CNI one is a Go template when it says so);
- kubeadm, kubelet and kubectl on PATH, containerd on /run/containerd/containerd.sock, systemd
  as PID 1 with a kubelet unit that starts once kubeadm has written its config;
- on cgroup v1, the entrypoint prints "detected cgroup v1" when the node may be used;
- the images kubeadm deploys are already in containerd (kind runs kubeadm without preflight,
  so nothing is pulled).

Layers (each cached under ``${ELASTRA_CACHE:-~/.cache/elastra}/images/layers`` by the hash of
its inputs, like e2e/images): the Debian root (debootstrap: systemd, containerd, runc, CNI
plugins, iptables), the Kubernetes binaries with this directory's ``node/`` files, and
containerd's store with the control-plane, etcd, CoreDNS, kube-proxy and pause images
preloaded (each image is the binary built by e2e/toolchain or e2e/kind/build.sh, packed with
e2e/images/archive.py). ``python -m e2e.kind.nodeimage build`` writes the image description;
``save`` streams a docker archive (``| docker load``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from e2e import hostpkgs
from e2e.images.archive import Layer, layer_from_dir, layer_from_files, write_archive
from e2e.images.build import (
    _cached_layer,
    _chroot_env,
    apt_mirror,
    build_pause,
    drop_layer_blobs,
)

HERE = Path(__file__).resolve().parent
NODE_FILES = HERE / "node"
# Bump when the recipe changes in a way the hashed inputs do not show.
RECIPE = "2"
NODE_PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "iproute2",
    "iptables",
    "conntrack",
    "ethtool",
    "socat",
    "kmod",
    "procps",
    "ca-certificates",
    "libseccomp2",
    "containerd",
    "runc",
    "containernetworking-plugins",
]
"""Debian packages of the node's root: systemd as PID 1, containerd + runc (the nodes' CRI),
the bridge/host-local/portmap/loopback CNI plugins, and the network tools the kubelet,
kube-proxy and the node's pod network call."""
IPTABLES_PACKAGES = [
    "libc6",
    "libgcc-s1",
    "gcc-12-base",
    "iptables",
    "libip4tc2",
    "libip6tc2",
    "libxtables12",
    "libnftnl11",
    "libmnl0",
    "libnetfilter-conntrack3",
    "libnfnetlink0",
    "conntrack",
    "netbase",
]
"""kube-proxy's image: its static binary plus iptables (nft backend, as in the node) and
conntrack, unpacked from these packages (`apt-cache depends --recurse` of iptables and
conntrack)."""
STATIC_IMAGES = {
    "kube-apiserver": "usr/local/bin/kube-apiserver",
    "kube-controller-manager": "usr/local/bin/kube-controller-manager",
    "kube-scheduler": "usr/local/bin/kube-scheduler",
    "etcd": "usr/local/bin/etcd",
    "coredns": "coredns",
}
"""Images that are one static binary at the path kubeadm's manifests run it from."""
NODE_BINARIES = {
    "kubelet": "usr/bin/kubelet",
    "kubeadm": "usr/bin/kubeadm",
    "kubectl": "usr/bin/kubectl",
    "runcwrap": "usr/local/sbin/runcwrap",
}
ENABLED_UNITS = ["containerd.service", "kubelet.service", "elastra-kind-cni.service"]
NODE_TAG = "elastra.local/kind-node:{version}"


def say(msg: str) -> None:
    print(f"kind-image: {msg}", file=sys.stderr, flush=True)


def _key(*parts: str | bytes) -> str:
    h = hashlib.sha256(("kind-" + RECIPE).encode())
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


def _file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(root)).encode())
            h.update(oct(path.stat().st_mode & 0o777).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
    say("$ " + " ".join(argv))
    return subprocess.run(argv, check=True, **kw)  # type: ignore[call-overload,no-any-return]


@dataclass(frozen=True)
class Binaries:
    """Where the binaries come from: the toolchain's bin dir and e2e/kind/build.sh's."""

    toolchain: Path
    kind: Path

    def path(self, name: str) -> Path:
        for folder in (self.kind, self.toolchain):
            if (folder / name).exists():
                return folder / name
        raise SystemExit(f"kind-image: error: no {name} in {self.kind} or {self.toolchain}")


def kubeadm_images(kubeadm: Path, version: str) -> dict[str, str]:
    """{component: tag} of the images kubeadm deploys for this version (kubeadm's own list)."""
    out = subprocess.run(
        [str(kubeadm), "config", "images", "list", f"--kubernetes-version={version}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    images: dict[str, str] = {}
    for tag in out.split():
        name = tag.rsplit("/", 1)[-1].split(":", 1)[0]
        images[name] = tag
    return images


# --- layer 1: the Debian root ----------------------------------------------------------------


def build_rootfs() -> Layer:
    """Debian minbase + NODE_PACKAGES, trimmed for a container (debootstrap: the slow part)."""
    mirror, suite = apt_mirror()
    key = _key("rootfs", mirror, suite, ",".join(NODE_PACKAGES))

    def make(out: Path) -> Layer:
        debootstrap = hostpkgs.require("debootstrap")
        rootfs = out.with_suffix(".rootfs")
        shutil.rmtree(rootfs, ignore_errors=True)
        _run(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={','.join(NODE_PACKAGES)}",
                suite,
                str(rootfs),
                mirror,
            ]
        )
        env = _chroot_env()
        # A container boots no hardware: units that wait for devices, consoles or kernel
        # modules only fail or hang there. journald must not read the host's kmsg.
        for unit in (
            "systemd-binfmt.service",
            "getty@tty1.service",
            "console-getty.service",
            "systemd-udevd.service",
            "systemd-modules-load.service",
            "sys-kernel-config.mount",
            "sys-kernel-debug.mount",
            "sys-kernel-tracing.mount",
        ):
            _run(["chroot", str(rootfs), "systemctl", "mask", unit], env=env)
        with (rootfs / "etc/systemd/journald.conf").open("a") as conf:
            conf.write("ReadKMsg=no\n")
        _run(["chroot", str(rootfs), "apt-get", "clean"], env=env)
        for sub in ("var/lib/apt/lists", "var/cache/apt", "var/log", "tmp"):
            shutil.rmtree(rootfs / sub, ignore_errors=True)
            (rootfs / sub).mkdir(parents=True, exist_ok=True)
        (rootfs / "tmp").chmod(0o1777)
        for name in ("etc/resolv.conf", "etc/hostname", "etc/machine-id"):
            (rootfs / name).unlink(missing_ok=True)
        layer = layer_from_dir(rootfs, out, excludes=("dev/*", "proc/*", "sys/*"))
        shutil.rmtree(rootfs)
        return layer

    return _cached_layer("kind-rootfs", key, make)


# --- layer 2: Kubernetes binaries and the node's files ----------------------------------------


def build_node_files(bins: Binaries, version: str, pause_tag: str) -> Layer:
    """kubelet/kubeadm/kubectl, the runc wrapper, node/ (units, entrypoint, manifests)."""
    paths = {name: bins.path(name) for name in NODE_BINARIES}
    key = _key(
        "node-files",
        version,
        pause_tag,
        _tree_hash(NODE_FILES),
        *(f"{n}={_file_hash(p)}" for n, p in sorted(paths.items())),
    )

    def make(out: Path) -> Layer:
        stage = out.with_suffix(".stage")
        shutil.rmtree(stage, ignore_errors=True)
        shutil.copytree(NODE_FILES, stage, symlinks=True)
        for name, dest in NODE_BINARIES.items():
            (stage / dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(paths[name], stage / dest)
            (stage / dest).chmod(0o755)
        config = stage / "etc/containerd/config.toml"
        config.write_text(config.read_text().replace("@PAUSE_IMAGE@", pause_tag))
        (stage / "kind/version").write_text(version + "\n")
        (stage / "etc/kubernetes/manifests").mkdir(parents=True)
        wants = stage / "etc/systemd/system/multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        for unit in ENABLED_UNITS:
            target = (
                f"/etc/systemd/system/{unit}"
                if (stage / "etc/systemd/system" / unit).exists()
                else f"/lib/systemd/system/{unit}"
            )
            (wants / unit).symlink_to(target)
        layer = layer_from_dir(stage, out)
        shutil.rmtree(stage)
        return layer

    return _cached_layer("kind-node-files", key, make)


# --- the images kubeadm deploys ---------------------------------------------------------------


@dataclass(frozen=True)
class PackedImage:
    tag: str
    layers: list[Layer]
    config: bytes


def _image_config(layers: list[Layer], entrypoint: list[str] | None) -> bytes:
    config: dict[str, object] = {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "WorkingDir": "/",
    }
    if entrypoint:
        config["Entrypoint"] = entrypoint
    body = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in layers]},
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def static_image(name: str, binary: Path, tag: str) -> PackedImage:
    dest = STATIC_IMAGES[name]
    key = _key("static", name, dest, _file_hash(binary))
    layer = _cached_layer(
        f"kind-{name}",
        key,
        lambda out: layer_from_files(
            {dest: (binary.read_bytes(), 0o755), "tmp/.keep": (b"", 0o644)}, out
        ),
    )
    entrypoint = ["/coredns"] if name == "coredns" else None
    return PackedImage(tag, [layer], _image_config([layer], entrypoint))


def iptables_layer() -> Layer:
    """IPTABLES_PACKAGES unpacked (apt-get download + dpkg-deb -x), iptables -> nft backend."""
    mirror, suite = apt_mirror()
    key = _key("iptables", mirror, suite, ",".join(IPTABLES_PACKAGES))

    def make(out: Path) -> Layer:
        work = out.with_suffix(".work")
        shutil.rmtree(work, ignore_errors=True)
        debs, root = work / "debs", work / "root"
        debs.mkdir(parents=True)
        root.mkdir()
        _run(["apt-get", "download", *IPTABLES_PACKAGES], cwd=debs)
        for deb in sorted(debs.glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(root)])
        # What update-alternatives would link (Debian's default: the nft backend).
        sbin = root / "usr/sbin"
        for tool in ("iptables", "ip6tables"):
            for suffix in ("", "-save", "-restore"):
                link = sbin / f"{tool}{suffix}"
                link.unlink(missing_ok=True)
                link.symlink_to(f"{tool}-nft{suffix}")
        (root / "tmp").mkdir(mode=0o1777, exist_ok=True)
        (root / "run").mkdir(exist_ok=True)
        layer = layer_from_dir(root, out)
        shutil.rmtree(work)
        return layer

    return _cached_layer("kind-iptables", key, make)


def kube_proxy_image(binary: Path, tag: str) -> PackedImage:
    base = iptables_layer()
    key = _key("kube-proxy", _file_hash(binary))
    layer = _cached_layer(
        "kind-kube-proxy",
        key,
        lambda out: layer_from_files(
            {"usr/local/bin/kube-proxy": (binary.read_bytes(), 0o755)}, out
        ),
    )
    layers = [base, layer]
    return PackedImage(tag, layers, _image_config(layers, None))


def preload_images(bins: Binaries, version: str) -> tuple[list[PackedImage], str]:
    """The images kubeadm will run, tagged as kubeadm names them; and the pause tag."""
    tags = kubeadm_images(bins.path("kubeadm"), version)
    images = [static_image(name, bins.path(name), tags[name]) for name in STATIC_IMAGES]
    images.append(kube_proxy_image(bins.path("kube-proxy"), tags["kube-proxy"]))
    pause = build_pause()
    images.append(PackedImage(tags["pause"], pause.layers, pause.config))
    return images, tags["pause"]


# --- layer 3: containerd's store with the images preloaded ------------------------------------


@contextmanager
def private_containerd(root: Path, work: Path) -> Iterator[str]:
    """containerd on root (the node's /var/lib/containerd) with its own socket; no CRI.

    Started and stopped by its PID. Its CRI plugin is off, so it sets up no networking.
    """
    containerd = hostpkgs.require("containerd")
    work.mkdir(parents=True, exist_ok=True)
    sock = work / "containerd.sock"
    config = work / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{root}"\n'
        f'state = "{work / "state"}"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{sock}"\n'
        f'[ttrpc]\n  address = "{sock}.ttrpc"\n'
        '[debug]\n  address = ""\n[metrics]\n  address = ""\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{work / "opt"}"\n'
    )
    log = (work / "containerd.log").open("wb")
    proc = subprocess.Popen([containerd, "--config", str(config)], stdout=log, stderr=log)
    try:
        for _ in range(100):
            if sock.exists():
                break
            if proc.poll() is not None:
                raise SystemExit(f"kind-image: containerd exited; see {work / 'containerd.log'}")
            time.sleep(0.1)
        yield str(sock)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def build_preloaded(images: list[PackedImage]) -> Layer:
    """/var/lib/containerd of a node with `images` imported (namespace k8s.io) and unpacked.

    Layer blobs are dropped once unpacked (the node's CRI runs with discard_unpacked_layers
    too): the snapshots are what containers start from, and keeping both doubled the size.
    """
    ctr = str(Path(hostpkgs.require("containerd")).with_name("ctr"))
    key = _key(
        "preload", *sorted(f"{i.tag}@{hashlib.sha256(i.config).hexdigest()}" for i in images)
    )

    def make(out: Path) -> Layer:
        work = Path(tempfile.mkdtemp(prefix="kind-preload-", dir=out.parent))
        stage = work / "layer"
        root = stage / "var/lib/containerd"
        root.mkdir(parents=True)
        try:
            with private_containerd(root, work / "run") as sock:
                base = [ctr, f"--address={sock}", "-n", "k8s.io"]
                for image in images:
                    say(f"preloading {image.tag}")
                    proc = subprocess.Popen(
                        [*base, "images", "import", "--all-platforms", "-"],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                    )
                    assert proc.stdin is not None
                    try:
                        write_archive(
                            proc.stdin, tag=image.tag, layers=image.layers, config=image.config
                        )
                    finally:
                        proc.stdin.close()
                    if proc.wait() != 0:
                        raise SystemExit(f"kind-image: ctr import of {image.tag} failed")
                layers = [layer for image in images for layer in image.layers]
                drop_layer_blobs(base, [layer.digest for layer in layers])
                # containerd deletes the files in its next garbage collection, soon after.
                files = [
                    root / "io.containerd.content.v1.content/blobs" / d.replace(":", "/")
                    for d in {layer.digest for layer in layers}
                ]
                for _ in range(150):
                    if not any(f.exists() for f in files):
                        break
                    time.sleep(0.2)
                listing = subprocess.run(
                    [*base, "images", "ls", "-q"], capture_output=True, text=True, check=True
                ).stdout.split()
                missing = sorted({i.tag for i in images} - set(listing))
                if missing:
                    raise SystemExit(f"kind-image: not in the preloaded store: {missing}")
            return layer_from_dir(stage, out)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return _cached_layer("kind-preload", key, make)


# --- the node image ---------------------------------------------------------------------------


def node_config(layers: list[Layer], version: str) -> bytes:
    body = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "container=docker",
            ],
            "Entrypoint": ["/usr/local/bin/entrypoint", "/sbin/init"],
            # systemd shuts down cleanly on SIGRTMIN+3 (docker stop).
            "StopSignal": "SIGRTMIN+3",
            "Labels": {"dev.elastra.kind-node.kubernetes": version},
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in layers]},
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def toolchain_version(toolchain: Path) -> str:
    for line in (toolchain.parent / "MANIFEST").read_text().splitlines():
        if line.startswith("kubernetes="):
            return line.split("=", 1)[1]
    raise SystemExit(f"kind-image: no kubernetes= line in {toolchain.parent / 'MANIFEST'}")


def build(bins: Binaries) -> PackedImage:
    started = time.monotonic()
    version = toolchain_version(bins.toolchain)
    say(f"[1/3] Debian root for the node ({len(NODE_PACKAGES)} packages, debootstrap)")
    rootfs = build_rootfs()
    say("[2/3] images kubeadm deploys (Kubernetes " + version + "), preloaded into containerd")
    images, pause_tag = preload_images(bins, version)
    preload = build_preloaded(images)
    say("[3/3] Kubernetes binaries and node files")
    files = build_node_files(bins, version, pause_tag)
    layers = [rootfs, files, preload]
    image = PackedImage(NODE_TAG.format(version=version), layers, node_config(layers, version))
    say(
        f"{image.tag}: {sum(la.size for la in layers) / 2**20:.0f} MiB in {len(layers)} layers "
        f"({time.monotonic() - started:.0f}s)"
    )
    return image


def description_path() -> Path:
    base = os.environ.get("ELASTRA_CACHE") or str(Path.home() / ".cache" / "elastra")
    return Path(base) / "kind" / "node-image.json"


def write_description(image: PackedImage) -> Path:
    path = description_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "tag": image.tag,
        "config": image.config.decode(),
        "layers": [layer.to_json() for layer in image.layers],
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    tmp.replace(path)
    return path


def read_description() -> PackedImage:
    path = description_path()
    if not path.exists():
        raise SystemExit("kind-image: no node image built yet: run `make kind-image`")
    raw = json.loads(path.read_text())
    layers = [Layer.from_json(item) for item in raw["layers"]]
    for layer in layers:
        if not layer.path.exists() or layer.path.stat().st_size != layer.size:
            raise SystemExit(f"kind-image: {layer.path} is missing: run `make kind-image` again")
    return PackedImage(str(raw["tag"]), layers, str(raw["config"]).encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.kind.nodeimage")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build (or reuse) the node image's layers")
    b.add_argument("--toolchain-bin", type=Path, required=True)
    b.add_argument("--kind-bin", type=Path, required=True)
    sub.add_parser("save", help="stream the built image as a docker archive to stdout")
    sub.add_parser("tag", help="print the built image's tag")
    args = parser.parse_args(argv)
    if args.command == "build":
        image = build(Binaries(args.toolchain_bin, args.kind_bin))
        say(f"description: {write_description(image)}")
        print(image.tag)
    elif args.command == "tag":
        print(read_description().tag)
    else:
        image = read_description()
        write_archive(sys.stdout.buffer, tag=image.tag, layers=image.layers, config=image.config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
