"""Image layers and docker-archive tarballs written without docker or a registry.

Why: no registry can be reached here and no docker daemon runs; containerd imports the tarball
`docker save` writes (`ctr -n k8s.io images import`), and that format is small: a tar holding
each layer as an uncompressed tar, an image config JSON named by its digest and a
`manifest.json` that ties them to a tag. Layers are made with GNU tar (numeric owners, xattrs,
hard links kept) and hashed while they are written, so a multi-GB layer is read once.

Guarantees: a layer file is complete when it exists (written to a temporary name, then renamed);
`write_archive` can stream to a pipe (ctr's stdin), so a big image is never copied twice on disk.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

CHUNK = 1 << 20


@dataclass(frozen=True)
class Layer:
    """One uncompressed layer tar and its digest (the image config's diff_id)."""

    path: Path
    digest: str  # "sha256:<hex>"
    size: int

    def to_json(self) -> dict[str, object]:
        return {"path": str(self.path), "digest": self.digest, "size": self.size}

    @staticmethod
    def from_json(raw: dict[str, Any]) -> Layer:
        return Layer(Path(raw["path"]), str(raw["digest"]), int(raw["size"]))


def _hash_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as src:
        while chunk := src.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def layer_from_dir(src: Path, out: Path, *, excludes: tuple[str, ...] = ()) -> Layer:
    """Tar the contents of src (as the image's /) into out, hashing while writing."""
    tmp = out.with_name(out.name + ".tmp")
    argv = [
        "tar",
        "-C",
        str(src),
        "--numeric-owner",
        "--xattrs",
        "--xattrs-include=security.capability",
        "--sort=name",
        *[f"--exclude=./{e}" for e in excludes],
        "-cf",
        "-",
        ".",
    ]
    h = hashlib.sha256()
    size = 0
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc, tmp.open("wb") as dst:
        assert proc.stdout is not None
        while chunk := proc.stdout.read(CHUNK):
            h.update(chunk)
            dst.write(chunk)
            size += len(chunk)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"tar of {src} failed (exit {proc.returncode})")
    tmp.replace(out)
    return Layer(out, "sha256:" + h.hexdigest(), size)


def layer_from_files(files: dict[str, tuple[bytes, int]], out: Path) -> Layer:
    """A small layer from in-memory files: {"usr/bin/pause": (content, mode)}.

    Parent directories are added (mode 0755, root-owned); mtimes are 0 so the digest depends
    on the content alone.
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        dirs: set[str] = set()
        for name in sorted(files):
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
            content, mode = files[name]
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = mode
            tar.addfile(info, io.BytesIO(content))
    data = buf.getvalue()
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return Layer(out, "sha256:" + hashlib.sha256(data).hexdigest(), len(data))


def image_config(
    layers: list[Layer],
    *,
    entrypoint: list[str] | None = None,
    cmd: list[str] | None = None,
    env: list[str] | None = None,
    workdir: str = "/",
    user: str = "",
    labels: dict[str, str] | None = None,
    exposed_ports: list[str] | None = None,
) -> bytes:
    """The OCI/docker image config for linux/amd64 (created: a fixed date, for stable digests)."""
    config: dict[str, object] = {
        "Env": env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "WorkingDir": workdir,
    }
    if entrypoint:
        config["Entrypoint"] = entrypoint
    if cmd:
        config["Cmd"] = cmd
    if user:
        config["User"] = user
    if labels:
        config["Labels"] = labels
    if exposed_ports:
        config["ExposedPorts"] = {p: {} for p in exposed_ports}
    body = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in layers]},
        "history": [
            {"created_by": f"elastra e2e/images layer {layer.digest[7:19]}"} for layer in layers
        ],
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))


def write_archive(dst: IO[bytes], *, tag: str, layers: list[Layer], config: bytes) -> None:
    """Write a docker-archive (`docker save` format) for one tagged image to dst (a stream)."""
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_names = [f"{layer.digest[7:]}/layer.tar" for layer in layers]
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": layer_names}]
    with tarfile.open(fileobj=dst, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        _add_bytes(tar, config_name, config)
        for layer, name in zip(layers, layer_names, strict=True):
            info = tarfile.TarInfo(name)
            info.size = os.stat(layer.path).st_size
            info.mode = 0o644
            with layer.path.open("rb") as src:
                tar.addfile(info, src)
        _add_bytes(tar, "manifest.json", json.dumps(manifest).encode())


def verify_layer(layer: Layer) -> bool:
    """True when the cached layer file still has its recorded digest (cheap size check first)."""
    if not layer.path.exists() or layer.path.stat().st_size != layer.size:
        return False
    return _hash_file(layer.path)[0] == layer.digest
