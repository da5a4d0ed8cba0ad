"""The device mesh of a plan: data parallel outermost, pipeline stages, tensor parallel inside.

The planner places every rank at a (dpRank, ppStage, tpRank) coordinate and the assignment
carries that map; this module turns it into a ``DeviceMesh`` with dimensions named ``dp``,
``pp`` and ``tp``, so each building block (FSDP2 on ``dp``, DTensor on ``tp``, the pipeline on
``pp``) gets its own process group from one place. The mesh is built from the coordinates, not
assumed row-major, so a plan whose ranks the planner numbered differently still runs as placed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .assignment import ParallelPlan, RankCoord

MESH_DIMS = ("dp", "pp", "tp")


def mesh_ranks(plan: ParallelPlan) -> torch.Tensor:
    """The global rank at every (dp, pp, tp) coordinate, as a (dp, pp, tp) integer tensor."""
    grid = torch.full((plan.dp, plan.pp, plan.tp), -1, dtype=torch.int64)
    for rank in range(plan.dp * plan.pp * plan.tp):
        c = plan.coord(rank)
        grid[c.dp_rank, c.pp_stage, c.tp_rank] = rank
    if bool((grid < 0).any()):
        raise ValueError(f"plan {plan.label}: the rank coordinates leave mesh positions empty")
    return grid


@dataclass(frozen=True)
class Mesh:
    """This rank's mesh and coordinates; ``device_mesh`` is ``None`` for pure data parallel."""

    plan: ParallelPlan
    coord: RankCoord
    device_mesh: DeviceMesh | None

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        """The group this rank reduces gradients in (``None``: the whole world)."""
        if self.device_mesh is None:
            return None
        return self.device_mesh.get_group("dp")

    @property
    def computes_loss(self) -> bool:
        """One rank per replica reports the loss: the last stage's first tensor-parallel rank."""
        return self.coord.pp_stage == self.plan.pp - 1 and self.coord.tp_rank == 0

    def sub(self, name: str) -> DeviceMesh:
        """The one-dimensional sub-mesh ``dp``, ``pp`` or ``tp``."""
        if self.device_mesh is None:
            raise RuntimeError(f"plan {self.plan.label} has no device mesh")
        return self.device_mesh[name]


def needs_mesh(plan: ParallelPlan) -> bool:
    """Pure replicated data parallel runs without a mesh (the world group is the dp group)."""
    return plan.tp > 1 or plan.pp > 1 or plan.sharding != "none"


def build_mesh(plan: ParallelPlan, rank: int, device: torch.device) -> Mesh:
    """Collective over the world: every rank must call it with the same plan."""
    coord = plan.coord(rank)
    if not needs_mesh(plan):
        return Mesh(plan, coord, None)
    device_mesh = DeviceMesh(device.type, mesh_ranks(plan), mesh_dim_names=MESH_DIMS)
    return Mesh(plan, coord, device_mesh)
