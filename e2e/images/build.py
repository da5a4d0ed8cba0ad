"""Build Elastra's images (pause, worker, operator) without a registry or a docker daemon.

Why: no image can be pulled here. The pause image is a static C program; the worker and
operator images are a Debian rootfs made by debootstrap (mirror read from this machine's apt
sources) plus wheels downloaded on the host and installed in the chroot with
`pip install --no-index`, packed as docker-archive tarballs (archive.py) and imported into a
node's containerd with `ctr -n k8s.io images import`.

Cache: ${ELASTRA_CACHE:-~/.cache/elastra}/images/<name>-<key>/ holds each layer tar and
image.json (tag, layers, config). Each layer's key hashes exactly its inputs, so a warm
rebuild only checks files, and changing elastra_worker rebuilds only the small app layer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from e2e import hostpkgs

from .archive import Layer, image_config, layer_from_dir, layer_from_files, write_archive

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PAUSE_TAG = "elastra.local/pause:1.0"
WORKER_TAG = "elastra.local/elastra-worker:dev"
OPERATOR_TAG = "elastra.local/elastra-operator:dev"
PYTHON_TAG = "elastra.local/debian-python:dev"
# Bump when the recipe changes in a way the hashed inputs do not show.
RECIPE = "1"
PY_PACKAGES = ["python3", "python3-venv", "libgomp1", "ca-certificates", "tini"]
# What the images hold, shared with the Dockerfiles (worker_image/Dockerfile,
# operator/Dockerfile): tests/unit/test_images.py fails when a recipe differs from these.
IMAGE_USER = "65532"
USERADD_OPTIONS = ["--no-log-init", "--create-home"]
"""--no-log-init: no lastlog/faillog entry, which for a high uid is a sparse file that an image
layer stores whole."""
APP_ROOT = "opt/elastra"
WORKER_REQUIREMENTS = ["torch", "numpy", "prometheus-client", "pyyaml", "s3fs", "cryptography"]
WORKER_APP_DIRS = ("elastra_worker", "examples")
"""worker_image/<dir> -> /opt/elastra/<dir>; the repository's examples/ is not in any image."""
WORKER_ENTRYPOINT = ["python3", "-m", "elastra_worker.cli", "run", "--"]
WORKER_CMD = ["python3", "/opt/elastra/examples/train_tiny_gpt.py"]
OPERATOR_REQUIREMENTS = [
    "pydantic",
    "pyyaml",
    "kopf",
    "aiohttp",
    "prometheus-client",
    "cryptography",
]
"""The elastra wheel's runtime dependencies (pyproject.toml [project] dependencies); not the
kubernetes client, which only the tests import (the dev extra)."""
OPERATOR_ENTRYPOINT = ["elastra", "run"]


def say(msg: str) -> None:
    print(f"images: {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    base = os.environ.get("ELASTRA_CACHE") or str(Path.home() / ".cache" / "elastra")
    return Path(base) / "images"


def _key(*parts: str | bytes) -> str:
    h = hashlib.sha256(RECIPE.encode())
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


def _tree_hash(root: Path, pattern: str = "**/*") -> str:
    h = hashlib.sha256()
    for path in sorted(root.glob(pattern)):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _run(argv: list[str], **kw: object) -> None:
    say("$ " + " ".join(argv))
    subprocess.run(argv, check=True, **kw)  # type: ignore[call-overload]


@dataclass(frozen=True)
class Image:
    tag: str
    layers: list[Layer]
    config: bytes

    @property
    def config_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.config).hexdigest()

    @property
    def size(self) -> int:
        return sum(layer.size for layer in self.layers)

    @property
    def digests(self) -> list[str]:
        """The layers' digests, lowest first (the config's diff_ids: the layers are plain tars)."""
        return [layer.digest for layer in self.layers]


KEPT_PER_NAME = 2
"""Cache entries kept per layer or wheel set name: the one in use and the newest other one
(another checkout sharing the cache, or the version just replaced). Without a bound, every
code change left a 100 MiB operator layer and every new pin a 5 GiB worker layer behind."""


def prune(folder: Path, name: str, key: str) -> list[Path]:
    """Delete <folder>/<name>-<other key>[.*] beyond KEPT_PER_NAME; marks <name>-<key> as used.

    Entries are ordered by their newest file's mtime, which use refreshes; returns what it
    deleted. Names are matched whole: pruning "worker" never touches "worker-app-<key>".
    """
    pattern = re.compile(rf"^{re.escape(name)}-([0-9a-f]{{12}})(\.[a-z]+)?$")
    groups: dict[str, list[Path]] = {}
    for path in folder.iterdir():
        match = pattern.match(path.name)
        if match:
            groups.setdefault(match.group(1), []).append(path)
    now = time.time()
    for path in groups.pop(key, []):
        os.utime(path, (now, now))
    others = sorted(groups.values(), key=lambda paths: max(p.stat().st_mtime for p in paths))
    doomed = [p for paths in others[: max(0, len(others) - (KEPT_PER_NAME - 1))] for p in paths]
    for path in doomed:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if doomed:
        say(f"cache: removed {len(doomed)} old {name} entr{'y' if len(doomed) == 1 else 'ies'}")
    return doomed


def _cached_layer(name: str, key: str, make: Callable[[Path], Layer]) -> Layer:
    """The layer <cache>/layers/<name>-<key>.tar, made by make(out) when missing."""
    folder = cache_root() / "layers"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}-{key}.tar"
    meta = out.with_suffix(".json")
    if meta.exists() and out.exists():
        layer = Layer.from_json(json.loads(meta.read_text()))
        if layer.path == out and out.stat().st_size == layer.size:
            say(f"layer {name}-{key}: cached ({layer.size / 2**20:.0f} MiB)")
            prune(folder, name, key)
            return layer
    started = time.monotonic()
    say(f"layer {name}-{key}: building ...")
    layer = make(out)
    meta.write_text(json.dumps(layer.to_json()) + "\n")
    say(
        f"layer {name}-{key}: built in {time.monotonic() - started:.0f}s "
        f"({layer.size / 2**20:.0f} MiB)"
    )
    prune(folder, name, key)
    return layer


# --- pause -----------------------------------------------------------------------------------


def build_pause() -> Image:
    source = HERE / "pause.c"
    gcc = hostpkgs.require("gcc")
    version = subprocess.run([gcc, "--version"], capture_output=True, text=True, check=True)
    key = _key(source.read_bytes(), version.stdout)

    def make(out: Path) -> Layer:
        binary = out.with_suffix(".bin")
        _run([gcc, "-static", "-Os", "-s", "-o", str(binary), str(source)])
        layer = layer_from_files({"pause": (binary.read_bytes(), 0o755)}, out)
        binary.unlink()
        return layer

    layer = _cached_layer("pause", key, make)
    config = image_config([layer], entrypoint=["/pause"], user="65535:65535")
    return Image(PAUSE_TAG, [layer], config)


# --- Debian rootfs ---------------------------------------------------------------------------


def apt_mirror() -> tuple[str, str]:
    """(mirror URI, suite) of this machine's main Debian source (deb822 or one-line format)."""
    suite = ""
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            suite = line.split("=", 1)[1].strip().strip('"')
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in sources:
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.strip()
            suites = fields.get("suites", "").split()
            if "deb" in fields.get("types", "").split() and suite in suites:
                return fields["uris"].split()[0], suite
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.list")]:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            words = re.sub(r"\[[^]]*\]", "", line).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                return words[1], suite
    raise SystemExit(f"images: error: no 'deb' source for suite {suite!r} in /etc/apt")


def _chroot_env() -> dict[str, str]:
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "DEBIAN_FRONTEND": "noninteractive",
    }


def build_base() -> Layer:
    """Debian minbase + python3 + the IMAGE_USER user, as one layer (debootstrap, the slow part)."""
    mirror, suite = apt_mirror()
    key = _key("base", mirror, suite, ",".join(PY_PACKAGES), IMAGE_USER)

    def make(out: Path) -> Layer:
        hostpkgs.require("debootstrap")
        rootfs = out.with_suffix(".rootfs")
        shutil.rmtree(rootfs, ignore_errors=True)
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PY_PACKAGES)}",
                suite,
                str(rootfs),
                mirror,
            ]
        )
        env = _chroot_env()
        _run(
            ["chroot", str(rootfs), "useradd", "--uid", IMAGE_USER, *USERADD_OPTIONS, "elastra"],
            env=env,
        )
        _run(["chroot", str(rootfs), "apt-get", "clean"], env=env)
        for sub in ("var/lib/apt/lists", "var/cache/apt", "var/log", "tmp"):
            shutil.rmtree(rootfs / sub, ignore_errors=True)
            (rootfs / sub).mkdir(parents=True, exist_ok=True)
        (rootfs / "tmp").chmod(0o1777)
        # The image's resolv.conf and hosts are bind-mounted by the runtime.
        for name in ("etc/resolv.conf", "etc/hostname"):
            (rootfs / name).unlink(missing_ok=True)
        layer = layer_from_dir(rootfs, out, excludes=("dev/*", "proc/*", "sys/*"))
        shutil.rmtree(rootfs)
        return layer

    return _cached_layer("base", key, make)


def download_wheels(name: str, requirements: list[str]) -> Path:
    """pip download (binary wheels only, constraints.txt pins) into the cache; reused when warm."""
    constraints = (REPO / "constraints.txt").read_bytes()
    key = _key("wheels", name, " ".join(requirements), constraints, sys.version.split()[0])
    folder = cache_root() / "wheels" / f"{name}-{key}"
    done = folder / ".complete"
    if done.exists():
        say(f"wheels {name}-{key}: cached ({len(list(folder.glob('*.whl')))} wheels)")
        prune(folder.parent, name, key)
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--progress-bar",
            "off",
            "--only-binary=:all:",
            "-c",
            str(REPO / "constraints.txt"),
            "-d",
            str(folder),
            "pip",
            *requirements,
        ]
    )
    done.write_text("")
    say(f"wheels {name}-{key}: downloaded in {time.monotonic() - started:.0f}s")
    prune(folder.parent, name, key)
    return folder


def _wheel_hash(folder: Path) -> str:
    """Names pin released wheels' contents; Elastra's own wheel keeps its name across code
    changes, so its bytes are hashed too (else the operator image kept stale code)."""
    return _key(
        *sorted(
            p.name
            + (
                ":" + hashlib.sha256(p.read_bytes()).hexdigest()
                if p.name.startswith("elastra-")
                else ""
            )
            for p in folder.glob("*.whl")
        )
    )


def build_site_layer(name: str, base: Layer, wheels: Path, requirements: list[str]) -> Layer:
    """/usr/local/lib/python3.*/dist-packages from `pip install --no-index` run in the chroot."""
    key = _key("site", base.digest, _wheel_hash(wheels), " ".join(requirements))

    def make(out: Path) -> Layer:
        work = out.with_suffix(".work")
        shutil.rmtree(work, ignore_errors=True)
        rootfs, site = work / "rootfs", work / "usr-local"
        rootfs.mkdir(parents=True)
        site.mkdir()
        _run(["tar", "-C", str(rootfs), "--numeric-owner", "-xf", str(base.path)])
        mounts = [(site, rootfs / "usr" / "local"), (wheels, rootfs / "wheels")]
        (rootfs / "wheels").mkdir()
        for src, dst in mounts:
            _run(["mount", "--bind", str(src), str(dst)])
        try:
            pip = sorted((rootfs / "wheels").glob("pip-*.whl"))[-1].name
            _run(
                [
                    "chroot",
                    str(rootfs),
                    "python3",
                    f"/wheels/{pip}/pip",
                    "install",
                    "--no-index",
                    "--find-links=/wheels",
                    "--no-cache-dir",
                    "--no-compile",
                    "--prefix=/usr/local",
                    "--break-system-packages",
                    "--root-user-action=ignore",
                    "--disable-pip-version-check",
                    *requirements,
                ],
                env=_chroot_env(),
            )
        finally:
            for _, dst in reversed(mounts):
                subprocess.run(["umount", str(dst)], check=False)
        staged = work / "layer" / "usr" / "local"
        staged.parent.mkdir(parents=True)
        site.rename(staged)
        layer = layer_from_dir(work / "layer", out)
        shutil.rmtree(work)
        return layer

    return _cached_layer(f"{name}-site", key, make)


def build_python() -> Image:
    """The base layer alone (Debian + python3): a small image for node and network tests."""
    base = build_base()
    config = image_config([base], cmd=["python3"], user=IMAGE_USER, workdir="/home/elastra")
    return Image(PYTHON_TAG, [base], config)


def build_sitepath_layer() -> Layer:
    """A .pth that puts /usr/local/lib/python3.*/site-packages on Debian python's sys.path.

    pip --prefix=/usr/local writes site-packages; Debian's python3 only reads dist-packages
    there. A .pth in /usr/lib/python3/dist-packages survives a pod that sets PYTHONPATH.
    """
    line = "/usr/local/lib/python3.11/site-packages\n"
    key = _key("sitepath", line)
    name = "usr/lib/python3/dist-packages/00-elastra-usr-local.pth"
    return _cached_layer(
        "sitepath", key, lambda out: layer_from_files({name: (line.encode(), 0o644)}, out)
    )


def build_worker() -> Image:
    base = build_base()
    wheels = download_wheels("worker", WORKER_REQUIREMENTS)
    site = build_site_layer("worker", base, wheels, WORKER_REQUIREMENTS)
    src = REPO / "worker_image"
    key = _key("worker-app", *(_tree_hash(src / sub) for sub in WORKER_APP_DIRS))

    def make(out: Path) -> Layer:
        files: dict[str, tuple[bytes, int]] = {}
        for sub in WORKER_APP_DIRS:
            for path in sorted((src / sub).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    rel = path.relative_to(src)
                    files[f"{APP_ROOT}/{rel}"] = (path.read_bytes(), 0o644)
        return layer_from_files(files, out)

    app = _cached_layer("worker-app", key, make)
    layers = [base, site, build_sitepath_layer(), app]
    config = image_config(
        layers,
        entrypoint=WORKER_ENTRYPOINT,
        cmd=WORKER_CMD,
        env=[
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            f"PYTHONPATH=/{APP_ROOT}",
            "PYTHONUNBUFFERED=1",
        ],
        user=IMAGE_USER,
        workdir="/home/elastra",
        exposed_ports=["9400/tcp"],
    )
    return Image(WORKER_TAG, layers, config)


def build_operator() -> Image:
    """The operator: the base rootfs plus the elastra wheel and its dependencies (no torch)."""
    base = build_base()
    sources = _key(
        _tree_hash(REPO / "operator" / "elastra"),
        (REPO / "pyproject.toml").read_bytes(),
    )
    wheels = download_wheels("operator", OPERATOR_REQUIREMENTS)
    own = cache_root() / "wheels" / f"elastra-{sources}"
    if not (own / ".complete").exists():
        own.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(own), str(REPO)])
        (own / ".complete").write_text("")
    prune(own.parent, "elastra", sources)
    for whl in own.glob("elastra-*.whl"):
        shutil.copy2(whl, wheels / whl.name)
    site = build_site_layer("operator", base, wheels, ["elastra"])
    layers = [base, site, build_sitepath_layer()]
    config = image_config(
        layers,
        entrypoint=OPERATOR_ENTRYPOINT,
        env=["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        user=IMAGE_USER,
        workdir="/home/elastra",
    )
    return Image(OPERATOR_TAG, layers, config)


BUILDERS: dict[str, Callable[[], Image]] = {
    "pause": build_pause,
    "python": build_python,
    "worker": build_worker,
    "operator": build_operator,
}


def save(image: Image, out: Path) -> None:
    """Write the image as a docker-archive tarball."""
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("wb") as dst:
        write_archive(dst, tag=image.tag, layers=image.layers, config=image.config)
    tmp.replace(out)


def drop_layer_blobs(ctr: list[str], digests: list[str], env: dict[str, str] | None = None) -> None:
    """Remove the layer blobs of an unpacked image from a containerd (``ctr`` names it).

    Why: containers start from the unpacked snapshots, so keeping the blobs too doubled what
    an image costs on disk (5.6 GiB more for the worker); CRI's discard_unpacked_layers does
    the same for pulled images. The archive's layers are uncompressed, so a layer blob's digest
    is its diff_id. One digest per call: ctr stops at the first one it cannot remove (already
    gone, or shared with an image removed before).
    """
    for digest in sorted(set(digests)):
        subprocess.run([*ctr, "content", "rm", digest], env=env, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def _ctr_import(image: Image, *, address: str, ctr: str) -> bool:
    """Stream the image's docker archive into ``ctr images import``; True when it succeeded."""
    proc = subprocess.Popen(
        [ctr, f"--address={address}", "-n", "k8s.io", "images", "import", "-"],
        stdin=subprocess.PIPE,
    )
    assert proc.stdin is not None
    try:
        write_archive(proc.stdin, tag=image.tag, layers=image.layers, config=image.config)
    finally:
        proc.stdin.close()
    return proc.wait() == 0


def import_image(image: Image, *, address: str, store: str = "", ctr: str = "ctr") -> None:
    """Stream the image into containerd (namespace k8s.io), unpacked, its layer blobs dropped;
    skip when that config is there.

    store names containerd's root (what was imported is remembered per store), else address.
    """
    ctr_argv = [ctr, f"--address={address}", "-n", "k8s.io"]
    probe = subprocess.run(
        [*ctr_argv, "images", "ls", f"name=={image.tag}"],
        capture_output=True,
        text=True,
        check=True,
    )
    marker = (
        cache_root() / "imported" / hashlib.sha256((store or address).encode()).hexdigest()[:12]
    )
    marker.mkdir(parents=True, exist_ok=True)
    record = marker / (image.tag.replace("/", "_").replace(":", "_") + ".json")
    lines = probe.stdout.splitlines()[1:]
    if lines and record.exists():
        digest = lines[0].split()[2]
        if json.loads(record.read_text()) == {"config": image.config_digest, "manifest": digest}:
            say(f"{image.tag}: already in {address}")
            drop_layer_blobs(ctr_argv, image.digests)  # a store filled before blobs were dropped
            return
    started = time.monotonic()
    say(f"{image.tag}: importing {image.size / 2**20:.0f} MiB into {address} ...")
    if not _ctr_import(image, address=address, ctr=ctr):
        # containerd can garbage-collect the snapshots of the image a new import replaces while
        # that import unpacks onto them ("parent snapshot ... does not exist"); the retry finds
        # the tag free and unpacks the whole chain.
        say(f"{image.tag}: import failed; removing the tag and importing once more")
        subprocess.run([*ctr_argv, "images", "rm", image.tag], check=False)
        if not _ctr_import(image, address=address, ctr=ctr):
            raise SystemExit(f"images: error: ctr import of {image.tag} failed twice")
    probe = subprocess.run(
        [*ctr_argv, "images", "ls", f"name=={image.tag}"],
        capture_output=True,
        text=True,
        check=True,
    )
    digest = probe.stdout.splitlines()[1].split()[2]
    drop_layer_blobs(ctr_argv, image.digests)
    record.write_text(json.dumps({"config": image.config_digest, "manifest": digest}))
    say(f"{image.tag}: imported in {time.monotonic() - started:.0f}s")


def orphan_refs(listing: str) -> list[str]:
    """The refs of ``ctr images ls`` output whose manifest no tag points to any more.

    Why: the kubelet's CRI plugin names each image it uses a second time, by its ID
    (sha256:<config>) and repo digest. When an import moves a tag to a new build, those names
    still hold the old build: in the node store kept across clusters, every worker rebuild
    left 11 GB (content + snapshot) behind until the disk filled.
    """
    rows = [line.split() for line in listing.splitlines()[1:] if line.strip()]
    tagged = {row[2] for row in rows if not row[0].startswith("sha256:") and "@" not in row[0]}
    return [row[0] for row in rows if row[2] not in tagged]


def remove_orphans(*, address: str, ctr: str = "ctr") -> list[str]:
    """Remove orphan_refs from containerd (namespace k8s.io) and wait for its garbage collector."""
    listing = subprocess.run(
        [ctr, f"--address={address}", "-n", "k8s.io", "images", "ls"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    orphans = orphan_refs(listing)
    if orphans:
        subprocess.run(
            [ctr, f"--address={address}", "-n", "k8s.io", "images", "rm", "--sync", *orphans],
            capture_output=True,
            check=False,
        )
        say(f"removed {len(orphans)} image name(s) that only held replaced builds")
    return orphans
