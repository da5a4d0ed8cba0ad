"""Build operator/Dockerfile and worker_image/Dockerfile with docker, offline, and compare them.

``python -m e2e.images.docker build|check|packages [worker] [operator]``

Why: users build the Dockerfiles; the tests ran only the offline builder's images (build.py).
Here no image registry answers, so the Dockerfiles start from the offline builder's base (Debian
minbase + python3, loaded into docker as PYTHON_TAG: build argument BASE) and install from the
offline builder's wheel cache, the same pinned wheels its images hold, served on loopback to
the build (build argument WHEELS; ``docker build --network host``). The cache rather than the
index: a cold CI run has already downloaded those 2.9 GB for the offline images, so the docker
build costs the install, not a second download, and needs no network but loopback.

``check`` compares the Python distributions (name, version) installed in each docker-built
image with those in the offline builder's site layer: the two build paths stay one.

The daemon is the one DOCKER_HOST names, else e2e/kind/dockerd.py's private one (started when
none answers), as for kind. Images are tagged as the offline ones (build.WORKER_TAG, ...), so
the e2e suite's pods name them alike; docker's store is not a cluster's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from e2e.kind.cluster import environment
from packaging.utils import canonicalize_name

from .archive import write_archive
from .build import (
    OPERATOR_REQUIREMENTS,
    OPERATOR_TAG,
    REPO,
    WORKER_REQUIREMENTS,
    WORKER_TAG,
    build_operator,
    build_python,
    build_worker,
    download_wheels,
    say,
)

BUILD_REQUIREMENTS = ["hatchling"]
"""The build backend of pyproject.toml: operator/Dockerfile's wheel stage builds elastra's
wheel with it, offline (build isolation installs it from WHEELS)."""
WHEELS_PORT = int(os.environ.get("ELASTRA_WHEELS_PORT", "38741"))
"""Fixed, because a build argument's value is part of docker's cache key: a port that changed
per run would rebuild the 5 GiB torch layer every time."""
DIST_INFO = re.compile(r"(?:^|/)(?:site|dist)-packages/([^/]+)-([^/-]+)\.dist-info/METADATA$")
"""An installed distribution's metadata; not the ones packages vendor (setuptools/_vendor/)."""
LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted([d.metadata['Name'], d.version] for d in m.distributions())))"
)


@dataclass(frozen=True)
class Recipe:
    """One Dockerfile and the offline image it must equal."""

    dockerfile: Path
    tag: str
    requirements: list[str]


RECIPES = {
    "worker": Recipe(REPO / "worker_image" / "Dockerfile", WORKER_TAG, WORKER_REQUIREMENTS),
    "operator": Recipe(REPO / "operator" / "Dockerfile", OPERATOR_TAG, OPERATOR_REQUIREMENTS),
}


def dist_infos(paths: list[str]) -> set[tuple[str, str]]:
    """(name, version) of each ``<site>/<name>-<version>.dist-info/METADATA`` among paths."""
    found = (DIST_INFO.search(path) for path in paths)
    return {(canonicalize_name(m.group(1)), m.group(2)) for m in found if m}


def differences(offline: set[tuple[str, str]], docker: set[tuple[str, str]]) -> list[str]:
    """One line per distribution the two builds do not share at one version (empty: equal)."""
    ours, theirs = dict(offline), dict(docker)
    lines = []
    for name in sorted(ours.keys() | theirs.keys()):
        a, b = ours.get(name, "absent"), theirs.get(name, "absent")
        if a != b:
            lines.append(f"{name}: offline {a}, Dockerfile {b}")
    return lines


def docker_env() -> dict[str, str]:
    """The environment for the docker CLI: DOCKER_HOST's daemon, else the kind one of ours."""
    if os.environ.get("DOCKER_HOST"):
        return dict(os.environ)
    return environment(start=True).vars


def docker(env: dict[str, str], *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], env=env, text=True, check=True, **kw)  # type: ignore[call-overload, no-any-return]


def load_base(env: dict[str, str]) -> str:
    """The offline builder's python image in docker (streamed in when its config differs)."""
    image = build_python()
    have = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", image.tag],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if have.returncode == 0 and have.stdout.strip() == image.config_digest:
        return image.tag
    say(f"{image.tag}: loading into docker ...")
    proc = subprocess.Popen(["docker", "load", "-q"], stdin=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    try:
        write_archive(proc.stdin, tag=image.tag, layers=image.layers, config=image.config)
    finally:
        proc.stdin.close()
    if proc.wait() != 0:
        raise SystemExit(f"images: error: docker load of {image.tag} failed")
    return image.tag


def wheel_folders(names: list[str]) -> list[Path]:
    """The offline builder's cached wheel sets the recipes install from (downloaded if cold)."""
    folders = [download_wheels(name, RECIPES[name].requirements) for name in names]
    if "operator" in names:
        folders.append(download_wheels("build", BUILD_REQUIREMENTS))
    return folders


@contextlib.contextmanager
def served(folders: list[Path]) -> Iterator[str]:
    """The wheels of folders as one flat listing on loopback; yields its URL."""
    with tempfile.TemporaryDirectory(prefix="elastra-wheels-") as tmp:
        for folder in folders:
            for wheel in folder.glob("*.whl"):
                link = Path(tmp) / wheel.name
                if not link.exists():
                    link.symlink_to(wheel)
        handler = functools.partial(_QuietHandler, directory=tmp)
        try:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEELS_PORT), handler)
        except OSError as err:
            raise SystemExit(
                f"images: error: cannot serve the wheels on 127.0.0.1:{WHEELS_PORT} ({err}); "
                "set ELASTRA_WHEELS_PORT to a free port"
            ) from err
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{WHEELS_PORT}/"
        finally:
            server.shutdown()
            server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def build(env: dict[str, str], name: str, *, base: str, wheels: str) -> float:
    """docker build of the recipe, tagged as the offline image; returns the seconds it took."""
    recipe = RECIPES[name]
    started = time.monotonic()
    say(f"{recipe.tag}: docker build -f {recipe.dockerfile.relative_to(REPO)} ...")
    docker(
        env, "build", "--network", "host", "--build-arg", f"BASE={base}",
        "--build-arg", f"WHEELS={wheels}", "-f", str(recipe.dockerfile), "-t", recipe.tag,
        str(REPO),
    )  # fmt: skip
    took = time.monotonic() - started
    size = docker(env, "image", "inspect", "--format", "{{.Size}}", recipe.tag,
                  capture_output=True).stdout  # fmt: skip
    say(f"{recipe.tag}: built from the Dockerfile in {took:.0f}s ({int(size) / 2**20:.0f} MiB)")
    return took


def docker_packages(env: dict[str, str], tag: str) -> set[tuple[str, str]]:
    """(name, version) of every distribution the image's python3 sees."""
    out = docker(env, "run", "--rm", "--network", "none", "--entrypoint", "python3", tag,
                 "-c", LIST_DISTRIBUTIONS, capture_output=True).stdout  # fmt: skip
    return {(canonicalize_name(n), v) for n, v in json.loads(out)}


def offline_packages(name: str) -> set[tuple[str, str]]:
    """(name, version) of the distributions in the offline image's layers."""
    image = build_worker() if name == "worker" else build_operator()
    found: set[tuple[str, str]] = set()
    for layer in image.layers:
        with tarfile.open(layer.path) as tar:
            found |= dist_infos(tar.getnames())
    return found


def check(env: dict[str, str], name: str) -> list[str]:
    lines = differences(offline_packages(name), docker_packages(env, RECIPES[name].tag))
    for line in lines:
        say(f"{name}: {line}")
    if not lines:
        say(f"{name}: the Dockerfile's image holds the offline image's packages")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.images.docker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["build", "check", "packages"])
    parser.add_argument("names", nargs="*", help=f"of {sorted(RECIPES)} (default: both)")
    args = parser.parse_args(argv)
    names = args.names or sorted(RECIPES, reverse=True)
    if unknown := sorted(set(names) - RECIPES.keys()):
        parser.error(f"no such image: {', '.join(unknown)} (known: {', '.join(sorted(RECIPES))})")
    env = docker_env()
    if args.command == "packages":
        for name in names:
            print(json.dumps(sorted(docker_packages(env, RECIPES[name].tag))))
        return 0
    if args.command == "build":
        base = load_base(env)
        with served(wheel_folders(names)) as url:
            for name in names:
                build(env, name, base=base, wheels=url)
    bad = [line for name in names for line in check(env, name)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
