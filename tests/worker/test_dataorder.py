"""Data order: a function of (seed, step) only; shares partition each step."""

from __future__ import annotations

import numpy as np
import pytest

from elastra_worker.dataorder import DataOrder, EpochPermutation, rank_shares


@pytest.mark.parametrize("size", [1, 2, 3, 17, 1000, 4097])
def test_epoch_permutation_is_a_bijection(size: int) -> None:
    out = EpochPermutation(size, seed=3, epoch=1)(np.arange(size))
    assert sorted(out.tolist()) == list(range(size))


def test_epochs_and_seeds_differ() -> None:
    a = EpochPermutation(1000, seed=0, epoch=0)(np.arange(1000)).tolist()
    assert a != EpochPermutation(1000, seed=0, epoch=1)(np.arange(1000)).tolist()
    assert a != EpochPermutation(1000, seed=1, epoch=0)(np.arange(1000)).tolist()


def test_each_epoch_visits_every_sample_once() -> None:
    order = DataOrder(seed=5, dataset_size=96, global_batch_size=32)
    first_epoch = [s for k in range(3) for s in order.step_samples(k)]
    assert sorted(first_epoch) == list(range(96))


def test_step_spanning_an_epoch_boundary() -> None:
    order = DataOrder(seed=5, dataset_size=50, global_batch_size=32)
    second = order.step_samples(1)  # positions 32..63: 18 from epoch 0, 14 from epoch 1
    assert len(second) == 32 and all(0 <= s < 50 for s in second)


@pytest.mark.parametrize("shares", [[32], [16, 16], [12, 10, 10], [8, 8, 8, 8], [6, 6, 4, 4, 12]])
def test_shares_partition_the_step_in_order(shares: list[int]) -> None:
    samples = DataOrder(seed=0, dataset_size=1000, global_batch_size=32).step_samples(7)
    got = [s for r in range(len(shares)) for share in rank_shares(samples, shares, r, 2)
           for s in share.samples]  # fmt: skip
    assert got == samples
    logical = [
        share.index for r in range(len(shares)) for share in rank_shares(samples, shares, r, 2)
    ]
    assert logical == list(range(16))  # logical share i is the same pair at every world size
