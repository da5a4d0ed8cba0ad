"""Which samples form global step k, independent of the world size.

A resized run must see the same samples per step as a static run, so the sample -> step map is a
function of (seed, dataset size, global batch, k) only. The global sample stream is epoch after
epoch of a keyed pseudo-random permutation of ``range(dataset_size)``; step k takes positions
``k*G .. k*G+G-1`` of that stream. The permutation is a 4-round Feistel network over the next
power of four with cycle walking: a bijection computed per index in O(1) memory, so datasets of
billions of samples need no shuffled index array, and no library's shuffle algorithm (which may
change between versions) decides the order.

A rank takes a contiguous slice of the step's G positions (uneven slices for heterogeneous
plans). Slices are cut into *logical shares* of ``micro_batch_size`` positions; in ``bitwise``
mode the logical shares are the unit of computation and of the fixed-order gradient sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

_MASK64 = (1 << 64) - 1
_ROUNDS = 4

U64Array = npt.NDArray[np.uint64]


def _mix64(x: int) -> int:
    """splitmix64's finaliser on a Python int: a good 64-bit mixing function."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _mix64_array(x: U64Array) -> U64Array:
    """The same finaliser over a uint64 array (numpy array arithmetic wraps mod 2**64)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class EpochPermutation:
    """A keyed bijection of ``range(size)``: ``perm(positions)`` maps positions to samples."""

    def __init__(self, size: int, *, seed: int, epoch: int) -> None:
        if size < 1:
            raise ValueError(f"dataset size must be >= 1, got {size}")
        self.size = size
        bits = max(2, (size - 1).bit_length())
        self._half = (bits + 1) // 2
        self._mask = np.uint64((1 << self._half) - 1)
        base = _mix64(_mix64(seed & _MASK64) ^ (epoch & _MASK64))
        self._keys = [np.uint64(_mix64(base + r + 1)) for r in range(_ROUNDS)]

    def _feistel(self, x: U64Array) -> U64Array:
        half = np.uint64(self._half)
        left = x >> half
        right = x & self._mask
        for key in self._keys:
            left, right = right, left ^ (_mix64_array(right ^ key) & self._mask)
        return (left << half) | right

    def __call__(self, positions: npt.ArrayLike) -> U64Array:
        x = np.asarray(positions, dtype=np.uint64)
        if x.size and int(x.max()) >= self.size:
            raise ValueError(f"position out of range for a permutation of {self.size}")
        y = self._feistel(x)
        out = y >= np.uint64(self.size)
        while out.any():  # cycle walking: at most a few rounds, the domain is < 4 * size
            y[out] = self._feistel(y[out])
            out = y >= np.uint64(self.size)
        return y


@dataclass(frozen=True)
class DataOrder:
    """The job's sample order: fixed by seed, dataset size and global batch size."""

    seed: int
    dataset_size: int
    global_batch_size: int

    def step_samples(self, step: int) -> list[int]:
        """The global sample indices of optimizer step ``step`` (0-based), in position order."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        start = step * self.global_batch_size
        stream = np.arange(start, start + self.global_batch_size, dtype=np.uint64)
        epochs = stream // np.uint64(self.dataset_size)
        positions = stream % np.uint64(self.dataset_size)
        out = np.empty_like(stream)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            perm = EpochPermutation(self.dataset_size, seed=self.seed, epoch=int(epoch))
            out[sel] = perm(positions[sel])
        return [int(v) for v in out]


@dataclass(frozen=True)
class Share:
    """One logical share (micro-batch) of a step: its index in the step and its samples."""

    index: int
    samples: tuple[int, ...]


def rank_slice(batch_shares: Sequence[int], dp_rank: int) -> tuple[int, int]:
    """Start and end positions (within a step) of data-parallel rank ``dp_rank``'s slice."""
    if not 0 <= dp_rank < len(batch_shares):
        raise ValueError(f"dp rank {dp_rank} outside {len(batch_shares)} shares")
    start = sum(batch_shares[:dp_rank])
    return start, start + batch_shares[dp_rank]


def rank_shares(
    samples: Sequence[int], batch_shares: Sequence[int], dp_rank: int, micro_batch_size: int
) -> list[Share]:
    """This rank's logical shares of a step: its slice cut into ``micro_batch_size`` pieces.

    Share indices count from the start of the step, so in ``bitwise`` mode (where every slice is
    a multiple of ``micro_batch_size``) share i holds the same samples whatever the world size.
    """
    if sum(batch_shares) != len(samples):
        raise ValueError(f"batch shares sum to {sum(batch_shares)}, step has {len(samples)}")
    start, end = rank_slice(batch_shares, dp_rank)
    shares: list[Share] = []
    for lo in range(start, end, micro_batch_size):
        hi = min(lo + micro_batch_size, end)
        shares.append(Share(index=lo // micro_batch_size, samples=tuple(samples[lo:hi])))
    return shares
