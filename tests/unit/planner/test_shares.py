"""Batch shares: every replica count up to the global batch's micro-batches can train.

Tables of (micro-batches, replicas per type, per-micro-batch times, bubble, unit) -> each
replica's micro-batches, a check of the water filling against exhaustive search, and whole
plans for world sizes the batch does not divide.
"""

from __future__ import annotations

import itertools
import math

import pytest

from elastra.planner import JobRequirements, ModelShape, plan_job
from elastra.planner.search import _split_batch

from .nodes import fleet

LLAMA_7B = ModelShape(32, 4096, 11008, 32, 32, 32000, 4096)


@pytest.mark.parametrize(
    ("micro_batches", "replicas", "times", "bubble", "unit", "expected"),
    [
        # even: every replica the same
        (96, (4,), (1.0,), 0.0, 1, ((24, 24, 24, 24),)),
        # the measured case: 256 sequences over 24 ranks
        (256, (24,), (1.0,), 0.0, 1, ((11,) * 16 + (10,) * 8,)),
        (8, (3,), (1.0,), 0.0, 1, ((3, 3, 2),)),
        # one micro-batch each is the least a replica can take
        (6, (6,), (1.0,), 0.0, 1, ((1,) * 6,)),
        # interleaving: whole rounds of pp=2 micro-batches per replica
        (16, (3,), (1.0,), 1.0, 2, ((6, 6, 4),)),
        # a faster type takes more: max(7*1, 3*2) = 7 beats max(6*1, 4*2) = 8
        (10, (1, 1), (1.0, 2.0), 0.0, 1, ((7,), (3,))),
        # a bubble counts against every replica alike: (6+3)*1 vs (3+3)*1.5
        (9, (1, 1), (1.0, 1.5), 3.0, 1, ((6,), (3,))),
        # a mix: 23 = 2x7 + 3x3 (slowest 7); 24 needs time 8, so one fast replica has 7
        (23, (2, 3), (1.0, 2.0), 0.0, 1, ((7, 7), (3, 3, 3))),
        (24, (2, 3), (1.0, 2.0), 0.0, 1, ((8, 7), (3, 3, 3))),
    ],
)
def test_split_gives_each_replica_its_micro_batches(  # noqa: PLR0917 (one table row)
    micro_batches: int,
    replicas: tuple[int, ...],
    times: tuple[float, ...],
    bubble: float,
    unit: int,
    expected: tuple[tuple[int, ...], ...],
) -> None:
    split = _split_batch(micro_batches, replicas, times, bubble=bubble, unit=unit)
    assert split == expected
    assert sum(map(sum, expected)) == micro_batches


@pytest.mark.parametrize(
    ("micro_batches", "replicas", "unit"),
    [
        (5, (6,), 1),  # fewer micro-batches than replicas
        (7, (2,), 2),  # not whole rounds of 2
        (6, (2, 2), 2),  # 3 rounds for 4 replicas
    ],
)
def test_split_refuses_what_cannot_be_formed(
    micro_batches: int, replicas: tuple[int, ...], unit: int
) -> None:
    times = (1.0,) * len(replicas)
    assert _split_batch(micro_batches, replicas, times, bubble=0.0, unit=unit) is None


def _best_by_search(
    micro_batches: int, replicas: tuple[int, ...], times: tuple[float, ...], bubble: float
) -> float:
    """The least slowest-replica time over every way to give each type a total."""
    best = math.inf
    for totals in itertools.product(*(range(r, micro_batches + 1) for r in replicas)):
        if sum(totals) != micro_batches:
            continue
        slowest = max(
            (math.ceil(total / r) + bubble) * t
            for total, r, t in zip(totals, replicas, times, strict=True)
        )
        best = min(best, slowest)
    return best


@pytest.mark.parametrize("micro_batches", [7, 12, 19, 30])
@pytest.mark.parametrize(
    ("replicas", "times", "bubble"),
    [
        ((2, 3), (1.0, 1.7), 0.0),
        ((1, 4), (0.4, 1.0), 1.0),
        ((3, 1, 2), (1.0, 3.1, 1.3), 0.5),
    ],
)
def test_split_is_as_fast_as_exhaustive_search(
    micro_batches: int, replicas: tuple[int, ...], times: tuple[float, ...], bubble: float
) -> None:
    split = _split_batch(micro_batches, replicas, times, bubble=bubble)
    assert split is not None and sum(map(sum, split)) == micro_batches
    slowest = max((max(ks) + bubble) * t for ks, t in zip(split, times, strict=True))
    assert slowest == pytest.approx(_best_by_search(micro_batches, replicas, times, bubble))
    assert all(max(ks) - min(ks) <= 1 for ks in split)


def job(**overrides: object) -> JobRequirements:
    fields: dict[str, object] = {
        "global_batch_size": 256,
        "replicas": 3,
        "min_replicas": 3,
        "gpus_per_worker": 8,
    }
    fields.update(overrides)
    return JobRequirements(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "dp", "shares"),
    [
        # no model: 24 ranks of one type share 256 sequences 11/10
        ({}, 24, (11,) * 16 + (10,) * 8),
        # a pinned micro-batch of 4: 64 logical shares over 24 replicas
        ({"micro_batch": 4}, 24, (12,) * 16 + (8,) * 8),
        # with a model and tp = pp = 1 fixed: shares stay whole micro-batches
        ({"model": LLAMA_7B, "tensor": 1, "pipeline": 1}, 24, None),
    ],
)
def test_three_pods_of_eight_train_a_batch_of_256(
    overrides: dict[str, object], dp: int, shares: tuple[int, ...] | None
) -> None:
    result = plan_job(job(**overrides), fleet(a100=4))
    assert result.feasible, result.reason
    best = result.plans[0]
    assert (len(best.pods), best.dp) == (3, dp)
    assert sum(best.batch_shares) == 256 and len(best.batch_shares) == dp
    assert all(s % best.micro_batch == 0 for s in best.batch_shares)
    if shares is not None:
        assert best.batch_shares == shares


def test_a_pinned_micro_batch_too_large_for_the_world_is_a_reason() -> None:
    result = plan_job(job(global_batch_size=64, micro_batch=4), fleet(a100=4))
    assert not result.feasible
    assert result.reason is not None
    assert "dp=24 replicas exceed the 16 micro-batches of 4" in result.reason


def test_pipeline_stages_get_the_default_layer_split() -> None:
    best = plan_job(
        job(model=LLAMA_7B, tensor=8, pipeline=3, global_batch_size=64, replicas=3), fleet(a100=4)
    ).plans[0]
    assert best.pp == 3
    assert [(s.start, s.stop) for s in best.stages][: best.pp] == [(0, 11), (11, 22), (22, 32)]
