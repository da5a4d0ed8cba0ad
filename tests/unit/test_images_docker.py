"""e2e/images/docker.py: the package lists it compares, read from layer paths and docker.

Building the Dockerfiles needs a docker daemon (`make images-docker`, and the kind chapter of
`make test`); what decides whether the two builds hold the same packages is tested here.
"""

from __future__ import annotations

import pytest
from e2e.images.docker import RECIPES, differences, dist_infos

SITE = "usr/local/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    "paths, found",
    [
        ([f"{SITE}/torch-2.15.0.dist-info/METADATA"], {("torch", "2.15.0")}),
        ([f"{SITE}/prometheus_client-0.26.0.dist-info/METADATA"],
         {("prometheus-client", "0.26.0")}),
        ([f"{SITE}/PyYAML-6.0.4.dist-info/METADATA"], {("pyyaml", "6.0.4")}),
        ([f"{SITE}/python_dateutil-2.9.0.post0.dist-info/METADATA"],
         {("python-dateutil", "2.9.0.post0")}),
        ([f"{SITE}/torch-2.15.0.dist-info/RECORD", f"{SITE}/torch/__init__.py"], set()),
        ([f"{SITE}/setuptools/_vendor/zipp-3.23.0.dist-info/METADATA"], set()),
        (["usr/lib/python3/dist-packages/six-1.17.0.dist-info/METADATA"], {("six", "1.17.0")}),
        ([f"{SITE}/a-1.dist-info/METADATA", f"{SITE}/b-2.dist-info/METADATA"],
         {("a", "1"), ("b", "2")}),
    ],
    ids=["plain", "underscore", "case", "post-release", "no-metadata", "vendored",
         "dist-packages", "two"],
)  # fmt: skip
def test_dist_infos_reads_name_and_version(paths: list[str], found: set[tuple[str, str]]) -> None:
    assert dist_infos(paths) == found


@pytest.mark.parametrize(
    "offline, docker, lines",
    [
        ({("torch", "2.15.0")}, {("torch", "2.15.0")}, []),
        ({("torch", "2.15.0")}, {("torch", "2.15.0+cpu")},
         ["torch: offline 2.15.0, Dockerfile 2.15.0+cpu"]),
        ({("torch", "2.15.0"), ("triton", "3.9.0")}, {("torch", "2.15.0")},
         ["triton: offline 3.9.0, Dockerfile absent"]),
        (set(), {("pip", "26.3")}, ["pip: offline absent, Dockerfile 26.3"]),
    ],
    ids=["equal", "other-build", "missing", "extra"],
)  # fmt: skip
def test_differences_name_each_package_that_differs(
    offline: set[tuple[str, str]], docker: set[tuple[str, str]], lines: list[str]
) -> None:
    assert differences(offline, docker) == lines


def test_names_are_compared_normalized() -> None:
    found = dist_infos(["usr/lib/python3/site-packages/Prometheus_Client-0.21.dist-info/METADATA"])
    assert differences({("prometheus-client", "0.21")}, found) == []


def test_each_recipe_names_a_dockerfile_of_the_repository() -> None:
    assert sorted(RECIPES) == ["operator", "worker"]
    assert all(r.dockerfile.is_file() for r in RECIPES.values())
