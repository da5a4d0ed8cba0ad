"""e2e/kind/hardlinks.py: a layer unpacked in two kind nodes becomes one copy on disk.

Linking a file that is not the same file would change what a node's containers see, so the
cases where the two trees disagree matter as much as the one where they agree.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e.kind.hardlinks import Linked, link_identical

MTIME_NS = 1_700_000_000 * 10**9


def unpack(root: Path, files: dict[str, bytes], mode: int = 0o644) -> None:
    """A layer's files as an unpack leaves them: same bytes, mode and time in every copy."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
        os.utime(path, ns=(MTIME_NS, MTIME_NS))


LAYER = {"usr/lib/libtorch.so": b"x" * 4096, "usr/lib/python3/torch/__init__.py": b"import os\n"}


def test_the_same_layer_unpacked_twice_becomes_one_copy(tmp_path: Path) -> None:
    first, second = tmp_path / "node1", tmp_path / "node2"
    unpack(first, LAYER)
    unpack(second, LAYER)
    assert link_identical(first, second) == Linked(files=2, bytes=4096 + 10)
    for rel, data in LAYER.items():
        assert (second / rel).samefile(first / rel)
        assert (second / rel).read_bytes() == data
    assert not list(second.rglob(".*.elastra-link"))
    assert link_identical(first, second) == Linked(), "a second pass finds nothing left"


def touched(path: Path) -> None:
    os.utime(path, ns=(MTIME_NS + 10**9, MTIME_NS + 10**9))


def grown(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"!")
    os.utime(path, ns=(MTIME_NS, MTIME_NS))


def made_executable(path: Path) -> None:
    path.chmod(0o755)


def replaced_by_a_link(path: Path) -> None:
    path.unlink()
    path.symlink_to("/etc/hostname")


def removed(path: Path) -> None:
    path.unlink()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(touched, id="another modification time"),
        pytest.param(grown, id="another size"),
        pytest.param(made_executable, id="another mode"),
        pytest.param(replaced_by_a_link, id="a symlink, not a file"),
        pytest.param(removed, id="missing in the reference"),
    ],
)
def test_a_file_that_differs_is_left_alone(tmp_path: Path, change: Callable[[Path], None]) -> None:
    first, second = tmp_path / "node1", tmp_path / "node2"
    unpack(first, LAYER)
    unpack(second, LAYER)
    change(first / "usr/lib/libtorch.so")
    before = (second / "usr/lib/libtorch.so").stat().st_ino
    linked = link_identical(first, second)
    assert linked == Linked(files=1, bytes=10), "only the file that agrees"
    assert (second / "usr/lib/libtorch.so").stat().st_ino == before
    assert (second / "usr/lib/libtorch.so").read_bytes() == LAYER["usr/lib/libtorch.so"]
