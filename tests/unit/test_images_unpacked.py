"""e2e/images/unpacked.py: which directories hold an image's unpacked layers.

The answer decides which files become hard links to which (e2e/kind/hardlinks.py): a layer
matched with the wrong directory would show a node's containers another layer's files.
"""

from __future__ import annotations

import pytest
from e2e.images.unpacked import chain_ids, lower_dirs

A, B, C = ("sha256:" + ch * 64 for ch in "abc")


@pytest.mark.parametrize(
    ("diff_ids", "want"),
    [
        pytest.param([], [], id="no layers"),
        pytest.param([A], [A], id="a base layer's chain is its diff_id"),
        pytest.param(
            [A, B, C],
            [
                A,
                "sha256:ccd722928bd92476ba1745586fed6e45a102504185ad88cd89e01ff116fd146c",
                "sha256:c1377126441fb2f5ec2c21ae2a60255331d639e830f0ee1b40a36e52d4c40588",
            ],
            id="sha256 of '<chain below> <diff_id>'",
        ),
    ],
)
def test_snapshot_keys_are_the_layers_chain_ids(diff_ids: list[str], want: list[str]) -> None:
    assert chain_ids(diff_ids) == want


SNAP = "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots"


@pytest.mark.parametrize(
    ("mounts", "want"),
    [
        pytest.param(
            [{"Type": "bind", "Source": f"{SNAP}/4/fs", "Options": ["ro", "rbind"]}],
            [f"{SNAP}/4/fs"],
            id="one layer: a bind mount of its directory",
        ),
        pytest.param(
            [{"Type": "overlay", "Source": "overlay",
              "Options": ["index=off", f"lowerdir={SNAP}/9/fs:{SNAP}/8/fs:{SNAP}/4/fs"]}],
            [f"{SNAP}/9/fs", f"{SNAP}/8/fs", f"{SNAP}/4/fs"],
            id="several: overlayfs's lowerdir, top first",
        ),
    ],
)  # fmt: skip
def test_a_views_mounts_name_the_layers_directories(
    mounts: list[dict[str, object]], want: list[str]
) -> None:
    assert lower_dirs(mounts) == want


@pytest.mark.parametrize(
    "mounts",
    [
        pytest.param([{"Type": "overlay", "Source": "overlay", "Options": ["upperdir=/u"]}],
                     id="no lowerdir"),
        pytest.param([], id="no mount"),
    ],
)  # fmt: skip
def test_mounts_that_are_not_a_view_are_an_error(mounts: list[dict[str, object]]) -> None:
    with pytest.raises(ValueError):
        lower_dirs(mounts)
