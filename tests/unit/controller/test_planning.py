"""The operator's questions to the planner, and the plan that travels to the workers.

``JobPlanner`` answers a pass's questions (where new pods go, whether a world should move,
how a set of pods trains) deriving the job's requirements once and planning each set of pods
once. The plan travels whole: for each job and cluster the operator forms a world (pure
passes on a fake cluster) and the CLI plans the same job on the same nodes; the assignment's
``plan`` must equal the CLI's plan field for field (per-replica shares, schedule, every
rank's coordinates, stage layers). Every world size the user asks for forms when capacity
exists, even one whose ranks the global batch does not divide evenly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from elastra.api import PlanStatus, parse_trainingjob
from elastra.cli import main
from elastra.controller.decide import planning
from elastra.controller.decide.capacity import cluster_inventory
from elastra.controller.decide.manifests import ANNOTATION_ASSIGNMENT, RankSpec, assignment_json
from elastra.controller.decide.observe import PodFacts
from elastra.controller.decide.planning import (
    JobPlanner,
    Placement,
    job_requirements,
    micro_batch_note,
    requirements,
)
from elastra.controller.settings import OperatorSettings
from elastra.elastic.workers import NodeName, PodName, WorkerState, WorkerView
from elastra.errors import UserError
from elastra.planner.record import assignment_plan
from elastra_worker.assignment import default_coords, parse_assignment, plan_to_wire
from tests.unit.controller.fakecluster import FakeCluster, gpt_job, node
from tests.unit.controller.test_passplan import SETTINGS, assignment

MODEL = {
    "layers": 32,
    "hiddenSize": 4096,
    "ffnHiddenSize": 11008,
    "attentionHeads": 32,
    "vocabSize": 32000,
    "sequenceLength": 4096,
}
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"


def manifest(replicas: int, batch: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "elastra.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "gpt", "namespace": "default", "uid": "u-1", "generation": 1},
        "spec": {
            "replicas": replicas,
            "minReplicas": replicas,
            "worker": {"gpus": 8, "image": "elastra-worker:dev"},
            "training": {"globalBatchSize": batch},
            "checkpoint": {"volume": "gpt-checkpoints"},
            **spec,
        },
    }


CASES = [
    pytest.param(manifest(3, 256), [H100] * 3, id="no-model-uneven-shares"),
    pytest.param(
        manifest(4, 96, model=MODEL, placement={"heterogeneous": True}),
        [H100, H100, A100, A100],
        id="mixed-types",
    ),
    pytest.param(
        manifest(4, 64, model=MODEL, parallelism={"mode": "manual", "tensor": 4, "pipeline": 4}),
        [H100] * 4,
        id="pipeline-stages",
    ),
]


def expected_from_cli(
    body: dict[str, Any], nodes: list[dict[str, Any]], tmp_path: Path, capsys: Any
) -> dict[str, Any]:
    job_file, nodes_file = tmp_path / "job.yaml", tmp_path / "nodes.yaml"
    job_file.write_text(yaml.safe_dump({k: v for k, v in body.items() if k != "status"}))
    items = [{"apiVersion": "v1", "kind": "Node", **n} for n in nodes]
    nodes_file.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    assert main(["plan", str(job_file), "--cluster", str(nodes_file), "-o", "json"]) == 0
    best = json.loads(capsys.readouterr().out)["plans"][0]
    ranks = [{k: r[k] for k in ("rank", "dpRank", "tpRank", "ppStage")} for r in best["placement"]]
    same = ("dp", "tp", "pp", "microBatchSize", "virtualStages", "schedule", "sharding")
    return {
        **{key: best[key] for key in same},
        "recompute": best["recompute"],
        "batchShares": best["replicaBatchShares"],
        "ranks": ranks,
        "stages": best["stages"],
    }


@pytest.mark.parametrize(("body", "products"), CASES)
def test_assignment_plan_is_what_elastra_plan_prints(
    body: dict[str, Any], products: list[str], tmp_path: Path, capsys: Any
) -> None:
    nodes = [node(f"n{i}", product=p) for i, p in enumerate(products)]
    expected = expected_from_cli(body, nodes, tmp_path, capsys)
    cluster = FakeCluster(body, nodes, SETTINGS)
    cluster.converge()
    assert cluster.job.status.world.replicas == len(products)
    for pod in cluster.pods.values():
        wire = json.loads(pod["metadata"]["annotations"][ANNOTATION_ASSIGNMENT])
        plan = parse_assignment(wire).plan  # as the worker reads it, defaults filled in
        size = plan.dp * plan.tp * plan.pp
        read = {
            **plan_to_wire(plan),
            "ranks": [plan_to_wire(replace(plan, ranks=(plan.coord(r),)))["ranks"][0]
                      for r in range(size)],
        }  # fmt: skip
        assert read == expected


@pytest.mark.parametrize(("dp", "most_bytes"), [(8, 1024), (4096, 1024)])
def test_the_assignment_leaves_out_what_the_worker_derives(dp: int, most_bytes: int) -> None:
    """No rank list (the default order) and no equal batch shares: the annotation's size does
    not grow with the world (it rides in every pod, to every watcher of pods)."""
    job = parse_trainingjob(manifest(dp, dp, model=MODEL))
    plan = assignment_plan(
        PlanStatus(dp=dp, tp=8, pp=1, dp_shares=[1] * dp), layers=MODEL["layers"]
    )
    world = dp * 8
    spec = RankSpec(rank=0, world_size=world, master_addr="gpt-w0.gpt", plan=plan)
    text = assignment_json(job, version=1, rank=spec, stop=False, settings=OperatorSettings())
    assert len(text.encode()) < most_bytes
    parsed = parse_assignment(text)
    assert parsed.plan.batch_shares == (1,) * dp
    assert parsed.plan.coord(world - 1) == default_coords(dp, 8, 1)[-1]


def on(node_name: str, slot: int) -> PodFacts:
    """A Ready pod of job ``gpt`` in ``slot``, bound to ``node_name``."""
    view = WorkerView(
        pod=PodName(f"gpt-w{slot}"),
        slot=slot,
        state=WorkerState.READY,
        since=datetime(2026, 1, 1, tzinfo=UTC),
        node=NodeName(node_name),
    )
    return PodFacts(
        view=view,
        raw={},
        assignment="",
        assignment_version=0,
        ip=None,
        bound=True,
        node_gone=False,
        gated=False,
        exit_code=None,
    )


def planner_on(count: int, **spec: Any) -> JobPlanner:
    job = parse_trainingjob(manifest(count, 8 * count, **spec))
    return JobPlanner(job, cluster_inventory([node(f"n{i}") for i in range(count)], []))


@pytest.mark.parametrize(
    ("replicas", "minimum", "bounds"), [(4, 1, (4, 1)), (2, 3, (2, 2)), (3, 3, (3, 3))]
)
def test_requirements_bound_the_pod_count(
    replicas: int, minimum: int, bounds: tuple[int, int]
) -> None:
    needs = requirements(parse_trainingjob(manifest(4, 32)), replicas=replicas, minimum=minimum)
    assert (needs.replicas, needs.min_replicas) == bounds


def counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls planning makes to its ``name``."""
    calls: list[int] = []
    real = getattr(planning, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(planning, name, wrapper)
    return calls


def test_a_pass_derives_the_requirements_once(monkeypatch: pytest.MonkeyPatch) -> None:
    derived = counting(monkeypatch, "requirements_from_spec")
    planner = planner_on(2)
    members = [on("n0", 0), on("n1", 1)]
    planner.place_new_pods(keep=members, count=1, desired=2)
    planner.relocate(members=members, standby=[], size=2)
    planner.plan_world(members)
    planner.plan_world(members[:1])
    assert len(derived) == 1


@pytest.mark.parametrize(
    ("first", "again", "calls"),
    [
        ([on("n0", 0), on("n1", 1)], [on("n1", 1), on("n0", 0)], 1),  # the same pods, any order
        ([on("gone", 0)], [on("gone", 0)], 0),  # a set that cannot train: the same error
    ],
)
def test_a_set_of_pods_is_planned_once_per_pass(
    monkeypatch: pytest.MonkeyPatch,
    first: Sequence[PodFacts],
    again: Sequence[PodFacts],
    calls: int,
) -> None:
    planned = counting(monkeypatch, "plan_job")
    planner = planner_on(2)
    answers = []
    for members in (first, again):
        try:
            answers.append(planner.plan_world(members))
        except UserError as err:
            answers.append(err)
    assert answers[0] is answers[1]
    assert len(planned) == calls


def test_no_new_pods_asked_asks_the_planner_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    planned = counting(monkeypatch, "plan_job")
    assert planner_on(2).place_new_pods(keep=[], count=0, desired=2) == Placement(pods=())
    assert planned == []


def test_a_world_on_the_best_plan_already_does_not_relocate() -> None:
    planner = planner_on(2)
    assert planner.relocate(members=[on("n0", 0), on("n1", 1)], standby=[], size=2) is None


def test_world_members_off_the_plan_leave_and_new_pods_take_its_open_slots() -> None:
    job = parse_trainingjob(manifest(2, 16))
    planner = JobPlanner(job, cluster_inventory([node("n0"), node("n1")], []))
    found = planner.relocate(members=[on("n0", 0), on("elsewhere", 1)], standby=[], size=2)
    assert found is not None
    assert found.leave == ("gpt-w1",)
    assert [p.node for p in found.pods] == ["n1"]


@pytest.mark.parametrize(
    ("batch", "nodes", "grown", "shares"),
    [
        # measured on the local cluster: 256 over 24 ranks stayed at 2 of 3 with no reason
        (256, 4, 3, [11] * 16 + [10] * 8),
        (96, 4, 3, [4] * 24),
        (100, 5, 4, [4] * 4 + [3] * 28),
    ],
)
def test_scaling_up_forms_a_world_the_batch_does_not_divide(
    batch: int, nodes: int, grown: int, shares: list[int]
) -> None:
    cluster = FakeCluster(
        gpt_job(2, training={"globalBatchSize": batch}),
        [node(f"a100-{i}", product=A100) for i in range(nodes)],
        SETTINGS,
    )
    cluster.converge()
    assert cluster.job.status.world.replicas == 2
    cluster.job_body["spec"]["replicas"] = grown
    cluster.converge()
    status = cluster.job.status
    assert status.world.replicas == grown and status.phase == "Running"
    assert next(c for c in status.conditions if c.type == "Degraded").status == "False"
    assert status.plan is not None and status.plan.dp_shares == shares
    plans = {parse_assignment(assignment(cluster, p)).plan.batch_shares for p in cluster.pods}
    assert plans == {tuple(shares)}


@pytest.mark.parametrize(
    ("training", "model", "recorded", "micro_batch", "noted"),
    [
        ({}, None, None, None, True),  # the planner chooses; without a model, 1, and says so
        ({}, MODEL, None, None, False),  # the planner sizes it from the model
        ({"microBatchSize": 4}, None, None, 4, False),  # the spec's size
        ({"microBatchSize": 4, "consistency": "bitwise"}, None, 2, 2, False),  # kept
        ({"consistency": "bitwise"}, None, None, None, True),
    ],
)
def test_the_micro_batch_comes_from_the_spec_and_a_default_is_said(
    training: dict[str, Any],
    model: dict[str, Any] | None,
    recorded: int | None,
    micro_batch: int | None,
    noted: bool,
) -> None:
    body = manifest(2, 64, training={"globalBatchSize": 64, **training})
    if model is not None:
        body["spec"]["model"] = model
    if recorded is not None:
        body["status"] = {"plan": {"dp": 2, "microBatchSize": recorded}}
    job = parse_trainingjob(body)
    assert job_requirements(job).micro_batch == micro_batch
    note = micro_batch_note(job)
    assert ("set training.microBatchSize" in note) is noted
