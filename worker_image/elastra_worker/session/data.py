"""The data position: how many optimizer steps are done, and which samples each step holds.

The order is a function of (seed, dataset size, global batch size) and the step alone
(``dataorder.DataOrder``), never of the world size, so the step count is the whole data
position a checkpoint needs. ``batches()`` and the ``torch.utils.data`` helpers
(``sampler()``, ``loader()``) read the same order from the same step.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from ..dataorder import DataOrder, Share, rank_shares
from ..errors import PermanentError
from ..layout import Manifest
from ..sampling import RankSlice, StepLoader, StepSampler
from .world import World


class DataPosition:
    """The step count (optimizer steps completed) and this data-parallel rank's samples."""

    def __init__(self, world: World) -> None:
        self._world = world
        self.step = 0
        """Optimizer steps completed: the next step to train."""
        self.restored = False
        """Whether ``restore`` has set the start step (the helpers start there)."""
        self.order: DataOrder | None = None
        self.sliced = False
        """Whether ``sampler()``/``loader()`` fixed a rank slice (a world change in memory
        would leave them reading another rank's samples)."""

    def restored_at(self, step: int) -> None:
        """The run continues at ``step`` (0: no checkpoint yet)."""
        self.step = step
        self.restored = True

    def begin(self, dataset_size: int, manifest: Manifest | None) -> None:
        """Fix the order for ``batches()``; it must be the restored checkpoint's order unless
        the job's consistency is ``none``."""
        a = self._world.assignment
        self.order = DataOrder(a.seed, dataset_size, a.global_batch_size)
        if manifest is None or a.consistency == "none":
            return
        saved = manifest.extra.get("dataOrder")
        now = self.manifest_extra()["dataOrder"]
        if saved is not None and saved != now:
            raise PermanentError(
                f"the checkpoint's data order {saved} differs from this run's {now}: "
                f"consistency {a.consistency} cannot hold; use the original values"
            )

    def manifest_extra(self) -> dict[str, Any]:
        """What a checkpoint's manifest records of the order (checked on restore)."""
        if self.order is None:
            raise RuntimeError("no data order yet: checkpoints are taken inside batches()")
        return {
            "dataOrder": {
                "seed": self.order.seed,
                "datasetSize": self.order.dataset_size,
                "globalBatchSize": self.order.global_batch_size,
            }
        }

    def step_samples(self, step: int) -> tuple[list[int], list[Share]]:
        """Every sample of global step ``step``, and this rank's logical shares of them."""
        if self.order is None:
            raise RuntimeError("no data order yet: call batches()")
        plan = self._world.plan
        samples = self.order.step_samples(step)
        shares = rank_shares(samples, plan.batch_shares, self._world.dp_rank, plan.micro_batch_size)
        return samples, shares

    def rank_slice(self, size: int, total_steps: int | None, start: int | None) -> RankSlice:
        """This rank's part of every step from ``start`` (default: the restored step)."""
        if start is None and not self.restored:
            raise RuntimeError("call session.restore() first: the data starts at its step")
        a, plan = self._world.assignment, self._world.plan
        self.sliced = True
        return RankSlice(
            order=DataOrder(a.seed, size, a.global_batch_size),
            batch_shares=tuple(plan.batch_shares),
            dp_rank=self._world.dp_rank,
            micro_batch_size=plan.micro_batch_size,
            start_step=self.step if start is None else start,
            total_steps=total_steps,
        )

    def sampler(self, size: int, total_steps: int | None, start: int | None) -> StepSampler:
        return StepSampler(self.rank_slice(size, total_steps, start))

    def loader(
        self,
        dataset: Dataset[Any],
        size: int,
        *,
        total_steps: int | None,
        start: int | None,
        dataloader_kwargs: dict[str, Any],
    ) -> StepLoader:
        return StepLoader(dataset, self.rank_slice(size, total_steps, start), **dataloader_kwargs)
