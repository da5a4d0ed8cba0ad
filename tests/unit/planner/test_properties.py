"""Properties of every plan, over random fleets and jobs (hypothesis).

No node gets more GPUs than it has free; every tensor-parallel group sits on one node;
each type's predicted memory fits its GPU (a mix's types may need different amounts); the
same input (in any node order) gives the same output; ``gpuTypes`` is honoured; infeasible
inputs give a reason and never raise.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from elastra.planner import JobRequirements, ModelShape, PlanResult, parse_inventory, plan_job
from elastra.planner.catalog import matches
from elastra.planner.inventory import Inventory
from elastra.planner.perfmodel import usable_memory_gib

from .nodes import node, node_list, pod

PRODUCTS = (
    "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-A100-SXM4-80GB",
    "NVIDIA-A100-SXM4-40GB",
    "NVIDIA-L40S",
)
MODELS = (
    None,
    ModelShape(12, 768, 3072, 12, 12, 50257, 1024),
    ModelShape(32, 4096, 11008, 32, 32, 32000, 4096),
    ModelShape(40, 5120, 13824, 40, 40, 32000, 2048),
    ModelShape(80, 8192, 28672, 64, 8, 32000, 4096),
)
PATTERNS = ("H100", "A100", "A100-40GB", "L40S", "NVIDIA-A100-SXM4-80GB")
PROPERTY_SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for index in range(draw(st.integers(1, 10))):
        name = f"n{index:02d}"
        product = draw(st.sampled_from(PRODUCTS))
        nodes.append(node(name, product=product, block=f"b{draw(st.integers(0, 2))}"))
        used = draw(st.integers(0, 8))
        if used:
            pods.append(pod(f"p{index}", name, gpus=used))
    return nodes, pods


@st.composite
def jobs(draw: st.DrawFn) -> JobRequirements:
    replicas = draw(st.integers(1, 8))
    model = draw(st.sampled_from(MODELS))
    manual = model is not None and draw(st.booleans())
    return JobRequirements(
        global_batch_size=draw(st.sampled_from((1, 8, 24, 64, 96, 512))),
        replicas=replicas,
        min_replicas=draw(st.integers(1, replicas)),
        gpus_per_worker=draw(st.sampled_from((1, 2, 4, 8))),
        model=model,
        gpu_types=tuple(draw(st.lists(st.sampled_from(PATTERNS), max_size=2, unique=True))),
        tensor=draw(st.sampled_from((1, 2, 4))) if manual else None,
        pipeline=draw(st.sampled_from((1, 2, 4))) if manual else None,
        objective=draw(st.sampled_from(("throughput", "cost"))),
        heterogeneous=draw(st.booleans()),
    )


def plan(
    fleet: tuple[list[dict[str, Any]], list[dict[str, Any]]], job: JobRequirements
) -> tuple[Inventory, PlanResult]:
    nodes, pods = fleet
    inventory = parse_inventory(node_list(*nodes), pods)
    return inventory, plan_job(job, inventory, top_k=2)


SMALL_MIX = (
    [
        node(f"n{i:02d}", product=product)
        for i, product in enumerate(
            [PRODUCTS[0]] * 3 + [PRODUCTS[1]] * 3 + [PRODUCTS[2], PRODUCTS[0]]
        )
    ],
    [pod("p2", "n02", gpus=1), pod("p7", "n07", gpus=5)],
)
"""Once found here: H100 replicas need 55.3 GiB, the A100-40GB replica (one micro-batch in
flight) 18.9 of its 36; the plan fits per type though its peak exceeds 36."""


@PROPERTY_SETTINGS
@given(fleets(), jobs())
@example(
    SMALL_MIX,
    JobRequirements(
        global_batch_size=24,
        replicas=6,
        min_replicas=6,
        gpus_per_worker=4,
        model=MODELS[2],
        sharding=("none", "optimizer", "full"),
        heterogeneous=True,
    ),
)
def test_every_plan_respects_capacity_tp_locality_memory_and_types(
    fleet: tuple[list[dict[str, Any]], list[dict[str, Any]]], job: JobRequirements
) -> None:
    inventory, result = plan(fleet, job)
    if not result.feasible:
        assert isinstance(result.reason, str) and result.reason
        return
    free = {n.name: n.free_gpus for n in inventory.nodes}
    types = {n.gpu_type.name: n.gpu_type for n in inventory.nodes}
    for candidate in result.plans:
        per_node = Counter(rank.node for rank in candidate.ranks)
        assert all(count <= free[name] for name, count in per_node.items())
        groups: dict[tuple[int, int], set[str]] = {}
        for rank in candidate.ranks:
            groups.setdefault((rank.dp_rank, rank.pp_stage), set()).add(rank.node)
        assert all(len(nodes) == 1 for nodes in groups.values())
        assert len(candidate.ranks) == candidate.gpus == candidate.dp * candidate.tp * candidate.pp
        assert job.min_replicas <= len(candidate.pods) <= job.replicas
        assert candidate.predicted.peak_memory_gib == max(
            s.peak_memory_gib for s in candidate.types
        )
        for share in candidate.types:
            gpu = types[share.gpu_type]
            assert share.peak_memory_gib <= usable_memory_gib(gpu)
            assert not job.gpu_types or any(matches(p, gpu) for p in job.gpu_types)
        shares = candidate.batch_shares
        assert len(shares) == candidate.dp and sum(shares) == job.global_batch_size
        assert all(s > 0 and s % candidate.micro_batch == 0 for s in shares)
        for share in candidate.types:  # one type's replicas differ by one micro-batch at most
            spread = max(share.replica_shares) - min(share.replica_shares)
            rounds = candidate.pp if candidate.interleave > 1 else 1
            assert spread <= candidate.micro_batch * rounds
        assert job.heterogeneous or len(candidate.types) == 1
        if job.tensor is not None:
            assert (candidate.tp, candidate.pp) == (job.tensor, job.pipeline)


@PROPERTY_SETTINGS
@given(fleets(), jobs(), st.randoms(use_true_random=False))
def test_same_input_same_output_in_any_node_order(
    fleet: tuple[list[dict[str, Any]], list[dict[str, Any]]], job: JobRequirements, rng: Any
) -> None:
    _, first = plan(fleet, job)
    nodes, pods = fleet
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    _, second = plan((shuffled, pods), job)
    assert first == second


@PROPERTY_SETTINGS
@given(fleets(), jobs())
def test_pruned_search_ranks_like_the_exhaustive_one(
    fleet: tuple[list[dict[str, Any]], list[dict[str, Any]]], job: JobRequirements
) -> None:
    nodes, pods = fleet
    inventory = parse_inventory(node_list(*nodes), pods)
    pruned = plan_job(job, inventory, top_k=2).plans
    exhaustive = plan_job(job, inventory, top_k=10_000).plans[:2]
    assert pruned == exhaustive
