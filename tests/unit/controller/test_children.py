"""The pod writes that make a job's children match its recorded world, one kind at a time.

Each table gives the job's pods (slot, state, and what differs from a Ready, ungated pod
that carries no assignment) and the resize decision; the rest of a pass is left out.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from elastra.api import TrainingJobStatus, parse_trainingjob
from elastra.api.reasons import Reason
from elastra.controller.decide.children import Children, children
from elastra.controller.decide.manifests import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_RETIRED,
    GANG_GATE,
    LABEL_LEADER,
    LABEL_WORLD,
)
from elastra.controller.decide.observe import PodFacts, format_time
from elastra.controller.decide.planning import NewPod, Placement
from elastra.elastic.resize import ResizeDecision
from elastra.elastic.workers import NodeName, PodName, WorkerState, WorkerView
from tests.unit.controller.fakecluster import T0, gpt_job
from tests.unit.controller.test_passplan import SETTINGS

READY, GATED, TERMINATING = WorkerState.READY, WorkerState.GATED, WorkerState.TERMINATING
JOB = parse_trainingjob(gpt_job(4, training={"globalBatchSize": 32}))


def pod(slot: int, state: WorkerState = READY, **changes: Any) -> PodFacts:
    retiring = changes.pop("retiring", False)
    view = WorkerView(
        pod=PodName(f"gpt-w{slot}"),
        slot=slot,
        state=state,
        since=T0,
        node=NodeName(f"n{slot}"),
        retiring_since=T0 if retiring else None,
    )
    fields: dict[str, Any] = {
        "raw": {},
        "assignment": "",
        "assignment_version": 0,
        "ip": None,
        "bound": state is not GATED,
        "node_gone": False,
        "gated": state is GATED,
        "exit_code": None,
    }
    return PodFacts(view=view, **{**fields, **changes})


def writes(
    pods: list[PodFacts],
    *,
    delete: tuple[int, ...] = (),
    retire: tuple[int, ...] = (),
    new: tuple[str, ...] = (),
    create: int = 0,
    ranks: tuple[int, ...] = (),
) -> Children:
    decision = ResizeDecision(
        world=None,
        reason=Reason.STEADY,
        message="",
        create=create,
        delete=frozenset(PodName(f"gpt-w{s}") for s in delete),
        retire=frozenset(PodName(f"gpt-w{s}") for s in retire),
    )
    world = {"version": 3, "ranks": [f"gpt-w{s}" for s in ranks], "replicas": len(ranks)}
    return children(
        JOB,
        TrainingJobStatus.model_validate({"world": world}),
        facts={str(p.name): p for p in pods},
        decision=decision,
        placement=Placement(pods=tuple(NewPod(node=n, gpu_type="H100") for n in new)),
        settings=SETTINGS,
        now=T0,
    )


@pytest.mark.parametrize(
    ("pods", "delete", "deletes"),
    [
        ([pod(0), pod(1)], (1,), ("gpt-w1",)),
        ([pod(0)], (0, 9), ("gpt-w0",)),  # a pod already gone is not deleted again
        ([pod(0, TERMINATING, node_gone=True)], (), ("gpt-w0",)),  # no kubelet will finish it
        ([pod(0, TERMINATING)], (), ()),  # its kubelet finishes it
    ],
)
def test_deletes(pods: list[PodFacts], delete: tuple[int, ...], deletes: tuple[str, ...]) -> None:
    assert writes(pods, delete=delete).deletes == deletes


@pytest.mark.parametrize(
    ("pods", "ranks", "new", "create", "names"),
    [
        ([], (), ("a", "b"), 2, [("gpt-w0", "a"), ("gpt-w1", "b")]),
        ([pod(0), pod(2)], (), ("a", "b", "c"), 2, [("gpt-w1", "a"), ("gpt-w3", "b")]),
        ([pod(0)], (), ("a",), 0, []),  # placed but not decided
        # a member of the recorded world whose create failed comes back in its own slot
        (
            [pod(0, GATED), pod(2, GATED)],
            (0, 2, 3),
            ("a", "b"),
            2,
            [("gpt-w3", "a"), ("gpt-w1", "b")],
        ),
    ],
)
def test_creates_take_the_lowest_free_slots_on_the_placed_nodes(
    pods: list[PodFacts],
    ranks: tuple[int, ...],
    new: tuple[str, ...],
    create: int,
    names: list[tuple[str, str]],
) -> None:
    created = writes(pods, new=new, create=create, ranks=ranks).creates
    placed = [
        (p["metadata"]["name"], p["metadata"]["annotations"]["elastra.dev/node"]) for p in created
    ]
    assert placed == names
    assert all(p["metadata"]["labels"][LABEL_WORLD] == "3" for p in created)


@pytest.mark.parametrize(
    ("pods", "delete", "new", "ungate"),
    [
        ([pod(0, GATED), pod(1, GATED)], (1,), ("a",), ("gpt-w0",)),
        ([pod(0, GATED)], (), ("a", "b"), ("gpt-w0", "gpt-w1")),
        ([pod(0), pod(1)], (), (), ()),
    ],
)
def test_gated_and_created_pods_are_ungated_together(
    pods: list[PodFacts], delete: tuple[int, ...], new: tuple[str, ...], ungate: tuple[str, ...]
) -> None:
    assert writes(pods, delete=delete, new=new, create=len(new)).ungate == ungate


def test_a_batch_is_created_gated_but_its_last_pod() -> None:
    created = writes([], new=("a", "b", "c"), create=3).creates
    gates = [p["spec"].get("schedulingGates") for p in created]
    assert gates == [[{"name": GANG_GATE}], [{"name": GANG_GATE}], None], (
        "the reconciler creates the last pod once the others exist: it needs no gate"
    )


def test_a_pod_is_patched_until_it_carries_its_assignment() -> None:
    ((name, patch),) = writes([pod(0)]).patches
    wanted = patch["metadata"]["annotations"][ANNOTATION_ASSIGNMENT]
    labels = {LABEL_WORLD: "3", LABEL_LEADER: None}  # None: the merge patch removes it
    assert (name, patch["metadata"]["labels"]) == ("gpt-w0", labels)
    assert json.loads(wanted)["worldVersion"] == 3
    assert writes([pod(0, assignment=wanted)]).patches == ()
    assert writes([pod(0, TERMINATING)]).patches == ()
    assert writes([pod(0)], delete=(0,)).patches == ()


def test_a_retiring_pod_is_told_to_stop_and_when_once() -> None:
    ((_, patch),) = writes([pod(0)], retire=(0,)).patches
    annotations = patch["metadata"]["annotations"]
    assert annotations[ANNOTATION_RETIRED] == format_time(T0)
    assert json.loads(annotations[ANNOTATION_ASSIGNMENT])["stop"] is True
    told = pod(0, retiring=True, assignment=annotations[ANNOTATION_ASSIGNMENT])
    assert writes([told], retire=(0,)).patches == ()
