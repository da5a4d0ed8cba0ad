"""A pod given GPUs trains on them or stops, with one line naming the cause.

torch's own answers (``torch.version.cuda``, ``torch.cuda.is_available``, ``device_count``) and
the container's device files are replaced at the boundary, so every cause is checked on a
machine without a GPU; a CPU pod and the ``ELASTRA_DEVICE=cpu`` choice are never checked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from elastra_worker import devices
from elastra_worker.exitcodes import CONFIG
from elastra_worker.termination import TERMINATION_LOG_ENV
from tests.worker.conftest import quiet_env


def fake_cuda(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    *,
    cuda: str | None,
    available: bool,
    count: int,
    nodes: int,
) -> None:
    """torch and /dev as a container with ``nodes`` GPU device files would show them."""
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in range(nodes):
        (dev / f"nvidia{i}").touch()
    (dev / "nvidiactl").touch()  # not a GPU: never counted
    monkeypatch.setattr(devices, "DEVICE_NODES", (str(dev / "nvidia[0-9]*"), str(dev / "kfd")))


CAUSES = [
    pytest.param(
        {"cuda": None, "available": False, "count": 0, "nodes": 1},
        "worker.gpus is 2 but the image's torch 2.15.0+cpu is a CPU build "
        "(torch.version.cuda is None): build the worker image with CUDA (or ROCm) torch",
        id="cpu-torch",
    ),
    pytest.param(
        {"cuda": "13.2", "available": False, "count": 0, "nodes": 0},
        "worker.gpus is 2 but no GPU driver is visible in the container (no /dev/nvidia* or "
        "/dev/kfd device; torch 2.15.0+cpu is built for CUDA 13.2): the node's GPU device "
        "plugin or container runtime did not give the pod its GPUs",
        id="no-device-files",
    ),
    pytest.param(
        {"cuda": "13.2", "available": False, "count": 0, "nodes": 2},
        "worker.gpus is 2 but CUDA is not available with 2 GPU device file(s) visible (torch "
        "2.15.0+cpu is built for CUDA 13.2): the node's driver is older than this build, or "
        "its libraries are not mounted into the container",
        id="driver-not-usable",
    ),
    pytest.param(
        {"cuda": "13.2", "available": True, "count": 1, "nodes": 1},
        "worker.gpus is 2 but torch sees only 1 CUDA device(s) (CUDA_VISIBLE_DEVICES=0)",
        id="fewer-devices",
    ),
]


@pytest.mark.parametrize(("facts", "line"), CAUSES)
def test_each_cause_is_named_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, facts: dict[str, object], line: str
) -> None:
    monkeypatch.setattr(torch, "__version__", "2.15.0+cpu")
    fake_cuda(monkeypatch, tmp_path, **facts)  # type: ignore[arg-type]
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    with pytest.raises(devices.GpuCheckError) as caught:
        devices.trainer_device(2, 1, environ=env)
    assert str(caught.value) == line
    assert "\n" not in line


@pytest.mark.parametrize(
    ("pod", "available", "want"),
    [
        ((2, {}), True, torch.device("cuda", 1)),  # a GPU pod with its GPUs: cuda:<local rank>
        ((0, {}), False, torch.device("cpu")),  # a CPU pod: never checked
        ((0, {}), True, torch.device("cuda", 1)),  # no gpus field: CUDA when there is one
        ((2, {"ELASTRA_DEVICE": "cpu"}), False, torch.device("cpu")),  # the explicit choice
    ],
)
def test_a_usable_device_is_chosen_without_a_check_where_none_is_due(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    pod: tuple[int, dict[str, str]],
    available: bool,
    want: torch.device,
) -> None:
    gpus, env = pod
    fake_cuda(monkeypatch, tmp_path, cuda="13.2", available=available, count=2, nodes=2)
    assert devices.trainer_device(gpus, 1, environ=env) == want


def test_rocm_torch_is_not_taken_for_cpu_torch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_cuda(monkeypatch, tmp_path, cuda=None, available=True, count=1, nodes=0)
    monkeypatch.setattr(torch.version, "hip", "6.4")
    assert devices.cuda_facts({}).gpu_build == "ROCm 6.4"
    assert devices.trainer_device(1, 0, environ={}) == torch.device("cuda", 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine whose torch sees no GPU")
def test_a_session_of_a_gpu_pod_without_gpus_exits_permanently_with_the_line(
    tmp_path: Path,
) -> None:
    """The Session's own check, in a real process: exit 2, the line on stderr and as the
    termination message, no traceback, nothing trained."""
    message = tmp_path / "termination-log"
    message.touch()  # the kubelet creates it; the worker only writes it
    assignment = (
        '{"job": "g", "worldVersion": 1, "rank": 0, "worldSize": 1, "masterAddr": "127.0.0.1", '
        '"masterPort": 29999, "globalBatchSize": 2, "gpus": 1, '
        f'"checkpoint": {{"path": "{tmp_path}"}}}}'
    )
    env = {**quiet_env(), "ELASTRA_ASSIGNMENT_JSON": assignment, TERMINATION_LOG_ENV: str(message)}
    env.pop("ELASTRA_DEVICE", None)
    script = "from elastra_worker.api import Session\nSession.from_env()\nprint('trained')\n"
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert out.returncode == CONFIG, out.stderr
    assert "trained" not in out.stdout and "Traceback" not in out.stderr
    line = message.read_text().strip()
    assert line.startswith("worker.gpus is 1 but "), line
    assert line in out.stderr
