"""The world a trainer is a member of: its rank, the plan's parallel dimensions, its device, the
process groups and the device mesh (what PyTorch's large-model trainers call ParallelDims).

``join`` forms this world version's process group: a TCPStore hosted by rank 0 under a fresh
namespace per version, nccl on GPUs (with a gloo group beside it for coordination: votes) or
gloo on CPU, and the plan's mesh. Their collectives time out after ``COLLECTIVE_TIMEOUT_S``; the
checkpoint manager adds a gloo group with a longer one for the state (saves, restores, peers).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..assignment import ASSIGNMENT_JSON_ENV, Assignment, assignment_from_env, parse_assignment
from ..control import CONTROL_DIR_ENV, ControlDir
from ..devices import GpuCheckError, trainer_device
from ..errors import PermanentError
from ..faults import Faults
from ..mesh import Mesh, build_mesh, needs_mesh
from ..precision import apply_tf32
from ..stalls import StallWatch

STEP_LOG_ENV = "ELASTRA_STEP_LOG"
COLLECTIVE_TIMEOUT_S = 90.0
"""How long a collective of training (gradients, the per-step vote) waits for a member before
it fails (``ELASTRA_COLLECTIVE_TIMEOUT`` sets another): shorter than the agent's stop timeout
(120 s), so a survivor blocked on a member cut off without a closed connection ends by itself,
exit code 69, even where no operator tells it. Work on the state that may keep one rank for
minutes (saves, restores, peer transfers, the wait for every member before the model's first
collective) runs on its own group, with ``session.checkpoints.STATE_TIMEOUT_S``."""


def arguments_from_env(env: dict[str, str]) -> tuple[Assignment, dict[str, Any]]:
    """The assignment and the ``Session`` arguments the agent (or torchrun, or nothing) put in
    the environment (``Session.from_env``)."""
    raw = env.get(ASSIGNMENT_JSON_ENV)
    assignment = parse_assignment(raw) if raw else assignment_from_env(env)
    args: dict[str, Any] = {
        "local_rank": int(env.get("LOCAL_RANK", "0")),
        "control": ControlDir(env[CONTROL_DIR_ENV]) if env.get(CONTROL_DIR_ENV) else None,
        "step_log": Path(env[STEP_LOG_ENV]) if env.get(STEP_LOG_ENV) else None,
        "faults": Faults.from_env(env),
        "stall_watch": StallWatch.from_env(env),
    }
    if env.get("ELASTRA_RENDEZVOUS_TIMEOUT"):
        args["rendezvous_timeout_s"] = float(env["ELASTRA_RENDEZVOUS_TIMEOUT"])
    if env.get("ELASTRA_COLLECTIVE_TIMEOUT"):
        args["collective_timeout_s"] = float(env["ELASTRA_COLLECTIVE_TIMEOUT"])
    return assignment, args


class World:
    """This trainer's place in one world version (rank, plan coordinates, groups, mesh)."""

    def __init__(
        self,
        assignment: Assignment,
        *,
        local_rank: int,
        device: torch.device | None,
        rendezvous_timeout_s: float,
        collective_timeout_s: float,
    ) -> None:
        self.local_rank = local_rank
        self._take(assignment)
        if device is None:
            try:
                device = trainer_device(assignment.gpus, local_rank)
            except GpuCheckError as err:  # a GPU pod that cannot see its GPUs: never on CPU
                raise PermanentError(str(err)) from None
        self.device = device
        self.rendezvous_timeout_s = rendezvous_timeout_s
        self.collective_timeout_s = collective_timeout_s
        self.group: dist.ProcessGroup | None = None
        """The coordination group (gloo); ``None``: the default group, itself gloo."""
        self._mesh: Mesh | None = None

    def _take(self, assignment: Assignment) -> None:
        """Hold ``assignment``'s rank, plan and settings (at the start, and on ``rejoin``)."""
        self.assignment = assignment
        self.rank = assignment.rank + self.local_rank
        self.world_size = assignment.world_size
        self.consistency = assignment.consistency
        self.seed = assignment.seed
        self.plan = assignment.plan
        self.coord = self.plan.coord(self.rank)
        self.dp_rank = self.coord.dp_rank
        self.precision = assignment.precision
        if self.consistency == "bitwise" and needs_mesh(self.plan):
            raise PermanentError(
                f"consistency bitwise is data parallel only (plan {self.plan.label}, sharding "
                f"{self.plan.sharding}): use consistency data for tensor, pipeline or sharded plans"
            )

    def rejoin(self, assignment: Assignment) -> None:
        """Leave this world version and join ``assignment``'s in the same process: the old
        groups are destroyed and the new version's rendezvous namespace is fresh, so nothing
        of the old world is reused but this process (and what it holds in memory)."""
        self.leave()
        self._mesh = None
        self.group = None
        self._take(assignment)
        self.join()

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    @property
    def mesh(self) -> Mesh:
        """This rank's device mesh and coordinates (after ``join``)."""
        if self._mesh is None:
            raise RuntimeError("session not started: use `with Session.from_env() as sess:`")
        return self._mesh

    def join(self) -> None:
        """Set the threads and TF32, rendezvous, and build the groups and the plan's mesh."""
        threads = os.environ.get("ELASTRA_THREADS")
        if threads:
            torch.set_num_threads(int(threads))
        elif self.consistency == "bitwise":
            torch.set_num_threads(1)  # the same intra-op split in every world
        try:
            apply_tf32()
        except ValueError as err:
            raise PermanentError(str(err)) from None
        a = self.assignment
        store = dist.TCPStore(  # type: ignore[attr-defined]  # exported, not declared
            a.master_addr,
            a.master_port,
            self.world_size,
            is_master=self.rank == 0,
            timeout=timedelta(seconds=self.rendezvous_timeout_s),
            wait_for_workers=False,
        )
        namespace = f"elastra/{a.job}/v{a.world_version}/"  # a fresh namespace per version
        prefixed = dist.PrefixStore(namespace, store)  # type: ignore[attr-defined]
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            self.backend,
            store=prefixed,
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=self.collective_timeout_s),
        )
        # Coordination (votes, checkpoint metadata) always runs on gloo, also next to nccl.
        self.group = self.gloo_group() if self.backend != "gloo" else None
        self._mesh = build_mesh(self.plan, self.rank, self.device)

    def gloo_group(self, *, timeout_s: float | None = None) -> dist.ProcessGroup:
        """A new gloo group of the whole world (collective: every rank creates it), whose
        collectives wait ``timeout_s`` (default: the world's collective timeout)."""
        timeout = timedelta(seconds=self.collective_timeout_s if timeout_s is None else timeout_s)
        group = dist.new_group(backend="gloo", timeout=timeout)
        if not isinstance(group, dist.ProcessGroup):
            raise RuntimeError("this rank is not in its own world's gloo group")
        return group

    def device_groups(self) -> dict[str, dist.ProcessGroup]:
        """The group that carries each device type's tensors in a state transfer (after
        ``join``; ``peers.share_state``): on GPUs the world's NCCL group for CUDA tensors,
        GPU to GPU; none on CPU, where the state group (gloo) carries everything."""
        if self.backend != "nccl":
            return {}
        world = dist.group.WORLD
        if not isinstance(world, dist.ProcessGroup):
            raise RuntimeError("the world's NCCL group is not formed (join first)")
        return {"cuda": world}

    def leave(self) -> None:
        """Destroy the process groups (nothing if the world was never joined)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def describe(self) -> str:
        """One line for the log: who joined what."""
        return (
            f"rank {self.rank}/{self.world_size} joined world version "
            f"{self.assignment.world_version} ({self.backend}, plan {self.plan.label}, "
            f"consistency {self.consistency}, precision {self.precision})"
        )
