"""``torch.utils.data`` on the job's world-size-independent sample order.

A map-style dataset read through a ``DataLoader`` (worker processes, pinned memory, prefetch)
must see the samples ``Session.batches()`` assigns, or a resized run trains on other data than a
static one. These classes turn the order of ``dataorder`` (``DataOrder`` + ``rank_shares``) into
what a ``DataLoader`` takes: ``StepSampler`` yields one data-parallel rank's sample indices of
every step from a start step on; ``MicroBatchSampler`` yields them cut into the rank's logical
shares (micro-batches), so ``DataLoader(dataset, batch_sampler=...)`` collates exactly one
micro-batch per item; ``StepLoader`` groups those into one list per step.

The DataLoader gets a generator of its own (seeded from the job's seed, the rank and the start
step) unless the script passes one, so making a loader does not draw from the global torch RNG
that the session checkpoints.

DataLoader worker processes are children of the trainer and inherit its SIGTERM handler (which
only sets a flag, so a worker would ignore the agent's SIGTERM). ``worker_init`` restores the
default SIGTERM action and arms ``PR_SET_PDEATHSIG`` against the trainer, so a worker never
outlives the trainer that the agent stops or kills.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .dataorder import DataOrder, Share, rank_shares
from .lifeline import die_with_parent


@dataclass(frozen=True)
class RankSlice:
    """Which part of every step one data-parallel rank reads, from which step to which."""

    order: DataOrder
    batch_shares: tuple[int, ...]
    dp_rank: int
    micro_batch_size: int
    start_step: int = 0
    total_steps: int | None = None

    def steps(self) -> Iterator[tuple[int, list[Share]]]:
        """``(step, this rank's shares)`` from ``start_step`` until ``total_steps`` (or forever)."""
        k = self.start_step
        while self.total_steps is None or k < self.total_steps:
            samples = self.order.step_samples(k)
            yield k, rank_shares(samples, self.batch_shares, self.dp_rank, self.micro_batch_size)
            k += 1

    def num_steps(self) -> int | None:
        """Steps left to read (``None``: unbounded)."""
        if self.total_steps is None:
            return None
        return max(0, self.total_steps - self.start_step)


class StepSampler(Sampler[int]):
    """This rank's sample indices of every step, flattened, in the job's order.

    With ``DataLoader(dataset, batch_size=n, sampler=...)`` where ``n`` divides this rank's
    share of a step, each step's samples arrive in ``share // n`` consecutive batches.
    """

    def __init__(self, part: RankSlice) -> None:
        self.part = part

    def __iter__(self) -> Iterator[int]:
        for _, shares in self.part.steps():
            for share in shares:
                yield from share.samples

    def __len__(self) -> int:
        steps = self.part.num_steps()
        if steps is None:
            raise TypeError("an unbounded sampler (total_steps=None) has no length")
        return steps * self.part.batch_shares[self.part.dp_rank]


class MicroBatchSampler(Sampler[list[int]]):
    """One list of sample indices per logical share (micro-batch): a ``batch_sampler``."""

    def __init__(self, part: RankSlice) -> None:
        self.part = part

    def __iter__(self) -> Iterator[list[int]]:
        for _, shares in self.part.steps():
            for share in shares:
                yield list(share.samples)

    def __len__(self) -> int:
        steps = self.part.num_steps()
        if steps is None:
            raise TypeError("an unbounded sampler (total_steps=None) has no length")
        share = self.part.batch_shares[self.part.dp_rank]
        return steps * -(-share // self.part.micro_batch_size)


def worker_init(trainer_pid: int, user_init: Callable[[int], None] | None, worker_id: int) -> None:
    """In a DataLoader worker: obey SIGTERM and die with the trainer, then the user's init."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(trainer_pid)
    if user_init is not None:
        user_init(worker_id)


def guarded_worker_init(user_init: Callable[[int], None] | None) -> Callable[[int], None]:
    """``worker_init`` bound to this process (the trainer) and the user's own init function."""
    return functools.partial(worker_init, os.getpid(), user_init)


class StepLoader:
    """Per step, the list of this rank's collated micro-batches (aligned with ``batches()``).

    Iterate it in lockstep with ``Session.batches()``; ``zip`` stops pulling from the loader when
    the session stops, and the DataLoader's workers end with the iterator.
    """

    def __init__(self, dataset: Dataset[Any], part: RankSlice, **dataloader_kwargs: Any) -> None:
        for key in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"):
            if key in dataloader_kwargs:
                raise TypeError(f"StepLoader chooses {key} itself (the job's sample order)")
        self.part = part
        # DataLoader draws its workers' base seed from ``generator``, by default from the
        # global torch RNG, which the session checkpoints: a loader made in every new world
        # would then shift the script's random stream against a static run.
        seed = hash((part.order.seed, part.dp_rank, part.start_step)) & 0x7FFF_FFFF_FFFF_FFFF
        dataloader_kwargs.setdefault("generator", torch.Generator().manual_seed(seed))
        init = dataloader_kwargs.pop("worker_init_fn", None)
        if dataloader_kwargs.get("num_workers", 0) > 0:
            dataloader_kwargs["worker_init_fn"] = guarded_worker_init(init)
        elif init is not None:
            dataloader_kwargs["worker_init_fn"] = init
        self.loader: DataLoader[Any] = DataLoader(
            dataset, batch_sampler=MicroBatchSampler(part), **dataloader_kwargs
        )

    def __iter__(self) -> Iterator[list[Any]]:
        items = iter(self.loader)
        for _, shares in self.part.steps():
            yield [next(items) for _ in shares]
