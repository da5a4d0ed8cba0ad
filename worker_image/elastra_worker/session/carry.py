"""A survivor of a resize: into the next world version in this process, its state in memory.

Why: restarting a trainer on every resize costs a process start, an import, a rendezvous and a
read of the whole state back from storage, and that read grows with the model. A trainer whose
pod stays in the next world (same number of trainers) needs none of that but the rendezvous:
at the step boundary its old world agreed to stop at, it leaves the old process group, joins
the new version's in the same process (a fresh rendezvous namespace, as a new process would),
and keeps training the model and optimizer it holds; the data position is the step count and
the order does not depend on the world size, so the new world's shares follow from the new
rank alone. Members the new world lacks state for (a grow's new pods, a restarted trainer) take
it from the survivors over the new group (``CheckpointManager.share_with_joiners``) instead of
reading the checkpoint.

Such a resize saves nothing on its critical path. The stop's save waits until every member of
the old world knows its next world (``save_or_hold``, one vote over the old group): where one
member carries the whole state into it in its own process, nobody saves; the new world, once
formed, stages the step and commits it in the background (``commit_held``), and until that
commit the newest checkpoint before it is the durable copy (a resize that fails in between
resumes from there and trains the steps since again, on the same samples). Otherwise (every
member restarts, a plan bound to its mesh, ``checkpoint.asynchronous: false``) the old world
commits the step before anyone leaves it, as a restart through the volume needs.

The agent offers the next assignment in the control folder (``next.json``) before it asks for
the stop; a trainer reports ``continued`` there and the agent keeps it. A world that ends at its
own stop step parks its trainers until the agent knows what comes next (``next_world``). What
cannot move in memory (``why_not_carried``) restarts as before, through the checkpoint, the
reason logged.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..assignment import Assignment, AssignmentError, parse_assignment
from ..control import ControlDir, TrainerStatus
from ..mesh import needs_mesh
from . import kept, rerun
from .data import DataPosition
from .model import ModelParts, rebind, rebindable
from .peers import agree_any
from .world import World

if TYPE_CHECKING:
    from .loop import StepParts

log = logging.getLogger(__name__)

KEPT_SETTINGS = ("job", "seed", "global_batch_size", "consistency", "precision")
"""Assignment fields a world change in memory must keep (the order, the numerics, the job)."""


def why_not_kept(old: Assignment, new: Assignment) -> str | None:
    """Why this trainer's process cannot go on into ``new`` at all (its pod leaves, its job's
    settings change), or ``None``."""
    if new.stop or new.waiting:
        return "this pod is in no next world"
    if new.local_world_size != old.local_world_size:
        return f"the pod's trainers change from {old.local_world_size} to {new.local_world_size}"
    changed = [f for f in KEPT_SETTINGS if getattr(old, f) != getattr(new, f)]
    if old.checkpoint.path != new.checkpoint.path or old.checkpoint.uri != new.checkpoint.uri:
        changed.append("checkpoint")
    if changed:
        return f"the next world changes {', '.join(changed)}"
    return None


def needs_rerun(old: Assignment, new: Assignment) -> bool:
    """Whether entering ``new`` from ``old`` takes the script run again (``rerun.py``): one of
    the plans binds the model to its mesh, and this process can run the script again."""
    return (
        (needs_mesh(old.plan) or needs_mesh(new.plan))
        and why_not_kept(old, new) is None
        and rerun.can_rerun()
    )


def may_rerun(world: World, control: ControlDir | None, *, asked: bool, at_stop_step: bool) -> bool:
    """Whether this trainer may enter the next world by running its script again, so every
    member should keep its part of the state in memory at this stop (it votes so): asked to
    stop with the next world offered, one it enters that way; or at the world's own stop step
    (the next world is not known yet: the agent offers it once the trainers park) when this
    world's plan binds the model to its mesh, as any next world then needs the script."""
    if control is None:
        return False
    if at_stop_step and needs_mesh(world.assignment.plan):
        return rerun.can_rerun()
    if not asked:
        return False
    try:
        new = offered_after(world, control.next_assignment())
    except AssignmentError:
        return False
    return new is not None and needs_rerun(world.assignment, new)


def why_not_carried(
    world: World, parts: ModelParts, data: DataPosition, new: Assignment
) -> str | None:
    """Why this trainer cannot move to ``new`` in its own process, or ``None`` if it can."""
    old = world.assignment
    blocked = why_not_kept(old, new)
    if blocked is not None:
        return blocked
    for which, plan in (("this", old.plan), ("the next", new.plan)):
        if needs_mesh(plan):
            return (
                f"{which} world's plan {plan.label} (sharding {plan.sharding}) is tensor, "
                "pipeline or sharded data parallel: its modules are built for that world's mesh"
            )
    if old.plan.recompute != new.plan.recompute:  # applied to the blocks by prepare()
        return f"the plan's recompute changes from {old.plan.recompute} to {new.plan.recompute}"
    if len(parts.parts) != 1 or not rebindable(parts.parts[0]) or parts.sharded():
        return (
            "the model is wrapped by the script (its own DDP, or FSDP): its process group is "
            "fixed when it is built"
        )
    if data.sliced:
        return "the script reads through sampler()/loader(), whose rank slice is fixed"
    return None


def save_or_hold(world: World, uses: StepParts, *, carries: bool) -> None:
    """The old world's deferred save, once every member knows its next world: none where a
    member carries the whole state into the next world in its own process (``carries`` on
    any rank; that world commits it in the background), else the blocking save the stop
    would have made. Collective over the old world, before anyone leaves it."""
    if agree_any(carries, group=world.group):
        uses.checkpoints.hold()
    else:
        uses.checkpoints.save(wait=True)


PARK_POLL_S = 0.05
"""How often a parked trainer looks for the agent's offer or stop (two ``stat`` calls)."""


def _report_continued(world: World, uses: StepParts, new: Assignment) -> None:
    """Tell the agent this trainer goes on into ``new`` (before the rendezvous, which may
    wait for new pods), once its background save is done."""
    checkpoints = uses.checkpoints
    checkpoints.wait()
    if uses.control is not None:
        uses.control.write_status(
            world.local_rank,
            TrainerStatus(
                state="continued",
                step=uses.data.step,
                checkpoint_step=checkpoints.last_committed_step,
                world_version=new.world_version,
            ),
        )


def next_world(world: World, uses: StepParts) -> Assignment | None:
    """The next world version the agent offered, if any. A world that stopped at its own stop
    step (``stopAtStep``: nobody asked) parks its trainers here, reported ``parked``, until the
    agent offers the next version or asks them to stop: the agent writes the offer before the
    stop, so a stop without an offer means none is coming."""
    control = uses.control
    if control is None:
        return None
    version = world.assignment.world_version
    parked = False
    while True:
        try:
            offered = offered_after(world, control.next_assignment())
        except AssignmentError as err:
            log.warning("rank %d: the offered next world is unreadable (%s): restarting",
                        world.rank, err)  # fmt: skip
            return None
        if offered is not None:
            break
        if control.stop_requested(version):
            return None
        if not parked:
            uses.stall_watch.disarm()  # waiting for the next world is no stall
            control.write_status(
                world.local_rank,
                TrainerStatus(state="parked", step=uses.data.step,
                              checkpoint_step=uses.checkpoints.last_committed_step,
                              world_version=version),
            )  # fmt: skip
            parked = True
        time.sleep(PARK_POLL_S)
    uses.stall_watch.arm()
    return offered


def offered_after(world: World, raw: str | None) -> Assignment | None:
    """The offer in ``raw`` when it is for a later world version than ``world``'s; ``None``
    for no offer, or the one that brought this trainer here (the agent clears it only once it
    sees the trainer arrive; a fast world may park before then). Raises ``AssignmentError``
    for an unreadable one (the trainer restarts)."""
    if raw is None:
        return None
    new = parse_assignment(raw)
    return new if new.world_version > world.assignment.world_version else None


def move_to_next_world(
    world: World, parts: ModelParts, uses: StepParts, *, unsaved: bool, leaving: bool
) -> bool:
    """After the old world's agreed stop: join the offered next world in this process and
    share the state with its joiners; ``False`` (nothing changed) where the trainer must
    restart instead. ``unsaved``: the stop deferred its save (``save_or_hold``); ``leaving``:
    this trainer got SIGTERM after the stop was agreed, so it goes nowhere."""
    new = None if leaving else next_world(world, uses)
    why = None if new is None else why_not_carried(world, parts, uses.data, new)
    if unsaved:
        save_or_hold(world, uses, carries=new is not None and why is None)
    if new is None:
        return False
    if why is not None and needs_rerun(world.assignment, new) and kept.holding():
        _report_continued(world, uses, new)
        log.info("rank %d runs its script again for world v%d: %s", world.rank,
                 new.world_version, why)  # fmt: skip
        raise rerun.WorldMoved(new, world.local_rank)
    if why is not None:
        log.info("rank %d restarts for world v%d: %s", world.rank, new.world_version, why)
        return False
    old_version, old_rank = world.assignment.world_version, world.rank
    _report_continued(world, uses, new)
    # The collectives in the order a joiner's script makes them: its Session opens the
    # checkpoints, prepare() waits for every member and builds DDP, restore() agrees on the
    # state's source.
    world.rejoin(new)
    uses.checkpoints.open()
    uses.checkpoints.wait_for_members()
    rebind(world, parts)
    uses.checkpoints.share_with_joiners()
    uses.checkpoints.commit_held()
    uses.recorder.clock.moved(new.world_version)
    log.info(
        "rank %d resumed step %d from memory into a world of %d (world v%d, plan %s; rank %d "
        "of world v%d before)",
        world.rank, uses.data.step, world.world_size, new.world_version, world.plan.label,
        old_rank, old_version,
    )  # fmt: skip
    return True
