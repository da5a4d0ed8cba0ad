"""``elastra status`` lists the nodes whose GPUs no job is planned on, as the planner reads
them, and says so when the nodes cannot be read."""

from __future__ import annotations

from pathlib import Path

import yaml

from elastra.api import TrainingJob, parse_trainingjob
from elastra.commands.status import render, unusable_nodes
from tests.cases.specs import base_manifest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "clusters"


def job() -> TrainingJob:
    body = base_manifest("gpt")
    body["metadata"].update(namespace="team-a", uid="u-1")
    return parse_trainingjob(body)


def test_nodes_left_out_for_their_gpus_are_listed_with_the_reason() -> None:
    """As the API lists them (items without a kind): the MIG, unknown and not-yet-advertised
    GPU nodes, not the NotReady one (its GPUs are fine) nor any usable node."""
    items = yaml.safe_load((FIXTURES / "mixed.yaml").read_text())["items"]
    for item in items:
        item.pop("kind")
    unusable = unusable_nodes(items)
    assert not isinstance(unusable, str)
    assert [n.name for n in unusable] == [
        "dgx-a100-mig-0",
        "dgx-a100-mig-1",
        "gpu-unlabelled-0",
        "ip-10-9-4-17.ec2.internal",
        "ws-rtx4090-0",
    ]
    text = render(job(), [], unusable=unusable)
    section = text.split("Nodes whose GPUs no job is planned on (5):\n", 1)[1].splitlines()
    assert section[0].startswith("  dgx-a100-mig-0: MIG partitions are not planned")
    assert section[4].startswith("  ws-rtx4090-0: 8 nvidia.com/gpu but no known GPU type in")


def test_no_section_when_every_gpu_node_is_usable_and_a_line_when_nodes_are_unreadable() -> None:
    items = yaml.safe_load((FIXTURES / "gke-a2.yaml").read_text())["items"]
    assert unusable_nodes(items) == []
    assert "Nodes" not in render(job(), [], unusable=[])
    forbidden = "403 Forbidden: nodes is forbidden"
    assert render(job(), [], unusable=forbidden).endswith(f"Nodes: not read ({forbidden})")


def test_a_resize_shows_how_long_it_stopped_training_once_measured() -> None:
    body = base_manifest("gpt")
    body["metadata"].update(namespace="team-a", uid="u-1")
    resize = {"fromVersion": 1, "toVersion": 2, "fromReplicas": 3, "toReplicas": 2,
              "reason": "ScaledDown", "time": "2026-12-04T01:00:00Z"}  # fmt: skip
    body["status"] = {"resizes": [resize, {**resize, "fromVersion": 2, "toVersion": 3,
                      "downtimeMillis": 12345, "stateFrom": "storage"}]}  # fmt: skip
    lines = render(parse_trainingjob(body), [], unusable=[]).split("Resizes:\n", 1)[1]
    first, second = lines.splitlines()[:2]
    assert first.endswith("ScaledDown"), "not reported yet: nothing invented"
    assert second.endswith("ScaledDown  stopped 12.3s (state from storage)")


def test_the_progress_line_says_the_goodput_once_reported() -> None:
    body = base_manifest("gpt")
    body["metadata"].update(namespace="team-a", uid="u-1")
    body["status"] = {"progress": {"step": 40, "samplesPerSecond": 12, "lastCheckpointStep": 32}}
    progress = "  progress: step 40, 12 samples/s, last checkpoint step 32"
    assert render(parse_trainingjob(body), [], unusable=[]).endswith(f"\n{progress}")
    body["status"]["progress"]["goodputPercent"] = 87
    shown = render(parse_trainingjob(body), [], unusable=[])
    assert shown.endswith(f"\n{progress}, goodput 87%")
