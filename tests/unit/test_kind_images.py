"""e2e/kind/images.py: which nodes get Elastra's images, and with which snapshotter.

A wrong choice shows only as pods stuck in ErrImageNeverPull minutes into a kind run, after
gigabytes were copied into the wrong nodes.
"""

from __future__ import annotations

import pytest
from e2e.kind.images import nodes_for_pods, snapshotter_of


@pytest.mark.parametrize(
    ("roles", "want"),
    [
        pytest.param(
            {"c-control-plane": "control-plane", "c-worker2": "worker", "c-worker": "worker"},
            ["c-worker", "c-worker2"],
            id="the workers only: kind keeps the control plane's NoSchedule taint",
        ),
        pytest.param(
            {"c-control-plane": "control-plane"}, ["c-control-plane"], id="one node runs pods"
        ),
        pytest.param({"a": "", "b": ""}, ["a", "b"], id="no role labels: every node"),
    ],
)
def test_images_go_to_the_nodes_that_run_pods(roles: dict[str, str], want: list[str]) -> None:
    assert nodes_for_pods(roles) == want


@pytest.mark.parametrize(
    ("dump", "want"),
    [
        pytest.param(
            '[plugins."io.containerd.grpc.v1.cri".containerd]\n  snapshotter = "native"\n',
            "native",
            id="as the node's CRI configures it",
        ),
        pytest.param("version = 2\n", "overlayfs", id="unset: containerd's default"),
    ],
)
def test_the_snapshotter_is_read_from_the_config_dump(dump: str, want: str) -> None:
    assert snapshotter_of(dump) == want
