"""Table tests: (inventory, job) -> the plan the planner should choose, or why none fits."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from elastra.planner import JobRequirements, ModelShape, parse_inventory, plan_job
from elastra.planner.catalog import by_name
from elastra.planner.inventory import Inventory
from elastra.planner.perfmodel import (
    DEFAULT_CONSTANTS,
    Layout,
    dp_collective_s,
    effective_gbs,
    usable_memory_gib,
)
from elastra.planner.search import TypePool, dp_bandwidth, evaluate_layout

from .nodes import fleet, node, node_list

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
LLAMA_7B = ModelShape(32, 4096, 11008, 32, 32, 32000, 4096)
LLAMA_70B = ModelShape(80, 8192, 28672, 64, 8, 32000, 4096)
SMALL_MODEL = ModelShape(24, 2048, 5504, 16, 16, 32000, 2048)


def job(**overrides: object) -> JobRequirements:
    fields: dict[str, object] = {
        "global_batch_size": 512,
        "replicas": 8,
        "min_replicas": 1,
        "gpus_per_worker": 8,
        "model": LLAMA_7B,
    }
    fields.update(overrides)
    return JobRequirements(**fields)  # type: ignore[arg-type]


def hetero_example() -> Inventory:
    return parse_inventory(yaml.safe_load((EXAMPLES / "nodes-hetero.yaml").read_text()))


def test_example_mixes_h100_and_a100_with_uneven_shares() -> None:
    result = plan_job(
        job(min_replicas=2, gpu_types=("H100", "A100"), heterogeneous=True), hetero_example()
    )
    best = result.plans[0]
    assert {s.gpu_type: s.gpus for s in best.types} == {"H100-SXM-80GB": 32, "A100-SXM-80GB": 32}
    h100, a100 = best.types
    assert h100.batch_share > a100.batch_share  # the faster type takes more of each step
    assert sum(s.replicas * s.batch_share for s in best.types) == 512
    assert best.dp == sum(s.replicas for s in best.types)
    assert len(best.ranks) == 64 and {r.node for r in best.ranks[:8]} == {"h100-0"}


def test_homogeneous_job_uses_one_type_the_fastest() -> None:
    result = plan_job(job(gpu_types=("H100", "A100")), hetero_example())
    assert [(s.gpu_type, s.gpus) for s in result.plans[0].types] == [("H100-SXM-80GB", 32)]
    assert all(len(p.types) == 1 for p in result.plans)


def test_gpu_types_restriction_is_honoured() -> None:
    result = plan_job(job(gpu_types=("A100",), heterogeneous=True), hetero_example())
    assert {s.gpu_type for p in result.plans for s in p.types} == {"A100-SXM-80GB"}
    assert any(r.category == "constraint" for r in result.rejections)


def test_a_mix_never_spans_gpu_vendors() -> None:
    """NCCL and RCCL do not talk to each other: H100 and MI300X replicas never share a world,
    while H100 and A100 (one vendor) still mix."""
    plans = plan_job(job(heterogeneous=True), fleet(h100=2, a100=2, mi300x=2), top_k=10).plans
    resources = [{by_name(s.gpu_type).resource for s in p.types} for p in plans]
    assert plans and all(len(r) == 1 for r in resources)
    assert any(len(p.types) > 1 for p in plans)


def test_manual_mode_fixes_tensor_and_pipeline() -> None:
    result = plan_job(job(tensor=4, pipeline=2), fleet(h100=4))
    assert {(p.tp, p.pp) for p in result.plans} == {(4, 2)}


def test_manual_tensor_that_does_not_divide_heads_is_a_reason() -> None:
    model = ModelShape(32, 4096, 11008, 32, 32, 32000, 4096)
    result = plan_job(job(model=model, tensor=3, gpus_per_worker=6), fleet(h100=1))
    assert not result.feasible
    assert (
        result.reason is not None and "tp=3 does not divide model.attentionHeads" in result.reason
    )


def test_70b_needs_model_parallelism_or_sharding_on_80gb() -> None:
    best = plan_job(job(model=LLAMA_70B, replicas=16), fleet(h100=16)).plans[0]
    assert best.tp * best.pp > 1 or best.sharding == "full"
    assert best.predicted.peak_memory_gib <= 80


SMALL_MIX_JOB = job(
    global_batch_size=24,
    replicas=6,
    min_replicas=6,
    gpus_per_worker=4,
    sharding=("none", "optimizer", "full"),
    heterogeneous=True,
)
"""Six 4-GPU pods of a 7B model on 4 H100 pods + 2 A100-40GB pods (a property test's find)."""


def test_a_mix_fits_each_type_to_its_own_memory() -> None:
    """The H100 replicas run 12 and 11 micro-batches and hold pp=4 in flight (55.3 GiB), the
    A100-40GB replica runs one and holds one (18.9 GiB, under its 36 GiB): the plan fits, and
    says what each type needs; the plan's peak is the largest of them."""
    plans = plan_job(SMALL_MIX_JOB, fleet(h100=2, a100_40=1), top_k=3).plans
    assert plans
    for plan in plans:
        needs = [s.peak_memory_gib for s in plan.types]
        assert plan.predicted.peak_memory_gib == max(needs)
        assert all(s.peak_memory_gib <= usable_memory_gib(by_name(s.gpu_type)) for s in plan.types)
    best = plans[0]
    assert [(s.gpu_type, s.replica_shares) for s in best.types] == [
        ("H100-SXM-80GB", (12, 11)),
        ("A100-SXM-40GB", (1,)),
    ]
    assert best.predicted.peak_memory_gib > usable_memory_gib(by_name("A100-SXM-40GB"))


@pytest.mark.parametrize(
    ("pods", "peaks", "reason"),
    [
        # the A100-40GB replica runs one micro-batch: 21.6 GiB fits its 36 GiB
        (
            (("H100-SXM-80GB", 4), ("A100-SXM-40GB", 2)),
            {"H100-SXM-80GB": 58.0, "A100-SXM-40GB": 21.6},
            None,
        ),
        # alone it runs all 24 and holds 4 in flight (dp=1: its shard is the whole state)
        (
            (("A100-SXM-40GB", 2),),
            {},
            "A100-SXM-40GB tp=2 pp=4 mb=1 sharding=optimizer recompute=none: "
            "needs 63.4 GiB > 36.0 GiB usable",
        ),
        ((("H100-SXM-80GB", 2),), {"H100-SXM-80GB": 63.4}, None),
    ],
)
def test_each_type_needs_the_memory_of_its_own_micro_batches_in_flight(
    pods: tuple[tuple[str, int], ...], peaks: dict[str, float], reason: str | None
) -> None:
    result = evaluate_layout(
        SMALL_MIX_JOB,
        fleet(h100=2, a100_40=1),
        Layout(2, 4, 1, "optimizer", "none", SMALL_MIX_JOB.precision),
        pods=pods,
    )
    needs = {s.gpu_type: round(s.peak_memory_gib, 1) for p in result.plans for s in p.types}
    assert needs == peaks
    assert (result.reason is None) == (reason is None)
    assert reason is None or (result.reason is not None and reason in result.reason)


def test_memory_too_small_everywhere_gives_a_memory_reason() -> None:
    result = plan_job(job(model=LLAMA_70B, replicas=1), fleet(a100_40=1))
    assert not result.feasible
    assert result.reason is not None and "memory" in result.reason


def test_not_enough_pods_gives_a_capacity_reason() -> None:
    result = plan_job(job(min_replicas=5), fleet(h100=4))
    assert not result.feasible
    assert result.reason is not None and "capacity" in result.reason


def test_bf16_job_never_lands_on_v100() -> None:
    result = plan_job(job(), fleet(v100=4))
    assert not result.feasible
    assert result.reason is not None and "no bf16 support" in result.reason
    assert plan_job(job(precision="fp16"), fleet(v100=4)).feasible


def test_cost_objective_prefers_tokens_per_dollar() -> None:
    inventory = fleet(h100=2, a100=2)
    cheap = plan_job(job(objective="cost", heterogeneous=True), inventory).plans[0]
    fast = plan_job(job(heterogeneous=True), inventory).plans[0]
    assert cheap.tokens_per_dollar >= fast.tokens_per_dollar
    assert fast.predicted.tokens_per_s >= cheap.predicted.tokens_per_s


def test_plans_are_ranked_best_first() -> None:
    plans = plan_job(job(), fleet(h100=4), top_k=5).plans
    speeds = [p.predicted.tokens_per_s for p in plans]
    assert speeds == sorted(speeds, reverse=True) and len(plans) == 5


def test_job_without_model_is_pure_data_parallel_with_speed_shares() -> None:
    inventory = parse_inventory(
        node_list(
            node("h", product="NVIDIA-H100-80GB-HBM3", gpus=1),
            node("t", product="Tesla-T4", gpus=1),
        )
    )
    result = plan_job(
        job(
            model=None,
            gpus_per_worker=1,
            replicas=2,
            global_batch_size=64,
            precision="fp16",
            heterogeneous=True,
        ),
        inventory,
    )
    best = result.plans[0]
    assert (best.tp, best.pp, best.dp) == (1, 1, 2)
    shares = {s.gpu_type: s.batch_share for s in best.types}
    assert shares["H100-SXM-80GB"] > shares["T4"] and sum(shares.values()) == 64


def test_cpu_job_runs_on_cpu_nodes_by_cores() -> None:
    inventory = parse_inventory(node_list(node("c", product=None, gpus=0, cpu="2"), node("g")))
    result = plan_job(
        job(
            model=None,
            gpus_per_worker=0,
            replicas=3,
            global_batch_size=24,
            cpus_per_worker=0.5,
            precision="fp32",
        ),
        inventory,
    )
    best = result.plans[0]
    assert best.dp == 3 and {p.node for p in best.pods} == {"c"}


def test_pipeline_stages_of_a_replica_stay_in_one_block() -> None:
    nodes = [node(f"n{i}", block=f"blk{i // 4}") for i in range(8)]
    result = plan_job(
        job(model=LLAMA_70B, replicas=8, tensor=8, pipeline=4), parse_inventory(node_list(*nodes))
    )
    best = result.plans[0]
    blocks = {r.node: f"blk{int(r.node[1:]) // 4}" for r in best.ranks}
    for replica in range(best.dp):
        assert len({blocks[r.node] for r in best.ranks if r.dp_rank == replica}) == 1


def slow_network_pool(pods: int) -> TypePool:
    """``pods`` free 8-GPU H100 pods on nodes whose NIC is 400 Gbit/s: 6.25 GB/s per GPU."""
    nodes = [
        node(f"h100-{i}", annotations={"elastra.dev/network-gbps": "400"}) for i in range(pods)
    ]
    inventory = parse_inventory(node_list(*nodes))
    return TypePool(
        gpu=inventory.nodes[0].gpu_type,
        nodes=inventory.nodes,
        slots=tuple((n.name, 1) for n in inventory.nodes),
        pods=pods,
        network_gbs=400 / 8 / 8,
    )


@pytest.mark.parametrize(
    ("pods", "tp", "pp", "rings"),
    [
        (2, 8, 1, 8),  # a replica per pod: each GPU's ring gets one GPU's share of the NIC
        (2, 8, 2, 8),  # a replica spans two pods: the same
        (2, 2, 2, 4),  # two replicas per pod: four rings share it
        (2, 1, 1, 1),  # pure data parallelism: one ring through the pod takes all of it
        (4, 1, 1, 1),
    ],
)
def test_data_parallel_rings_share_the_pods_network_by_tp_and_pp(
    pods: int, tp: int, pp: int, rings: int
) -> None:
    pool = slow_network_pool(pods)
    got = dp_bandwidth((pool,), (pods,), replica_gpus=tp * pp, devices_per_worker=8)
    assert got == effective_gbs(6.25 * 8 / rings, intra_node=False, constants=DEFAULT_CONSTANTS)


def test_one_pod_reduces_over_its_gpus_interconnect_whatever_the_layout() -> None:
    pool = slow_network_pool(1)
    for tp in (1, 2, 8):
        got = dp_bandwidth((pool,), (1,), replica_gpus=tp, devices_per_worker=8)
        assert got == effective_gbs(
            pool.gpu.interconnect_gbs, intra_node=True, constants=DEFAULT_CONSTANTS
        )


def test_pure_data_parallelism_over_pods_is_predicted_with_the_pods_whole_network_share() -> None:
    """The prediction this changes: before, every ring got one GPU's share of the NIC whatever
    tp and pp were, so a tp=1 layout over pods paid 8x its data-parallel time."""
    layout = Layout(1, 1, 1, "optimizer", "none", "bf16")
    pool = slow_network_pool(2)
    result = evaluate_layout(
        job(replicas=2, global_batch_size=64, model=SMALL_MODEL),
        Inventory(nodes=pool.nodes),
        layout,
        pods=(("H100-SXM-80GB", 2),),
    )
    plan = result.plans[0]
    breakdown = dict(plan.predicted.breakdown)
    micro_batches = plan.types[0].batch_share // layout.micro_batch
    hidden = DEFAULT_CONSTANTS.dp_overlap * (2.0 / 3.0) * breakdown["compute"] / micro_batches

    def exposed(per_gpu_gbs: float) -> float:
        bandwidth = effective_gbs(per_gpu_gbs, intra_node=False, constants=DEFAULT_CONSTANTS)
        raw = dp_collective_s(
            SMALL_MODEL, layout, dp=16, micro_batches=micro_batches, bandwidth_gbs=bandwidth
        )
        return max(0.0, raw - hidden)

    assert breakdown["dp-comm"] == pytest.approx(exposed(6.25 * 8))
    assert breakdown["dp-comm"] < 0.5 * exposed(6.25)  # one GPU's share: the old prediction
