"""A plain DDP training script that survives resizes under Elastra's torchrun mode (or torchrun).

Nothing here imports Elastra. The script reads torchrun's variables, joins the world with
``init_process_group(init_method="env://")`` (rank 0 hosts the store), and keeps itself elastic
with three habits:

1. It checkpoints to ``$ELASTRA_CHECKPOINT_DIR`` (model, optimizer, next step) with
   ``torch.save`` to a temp file and ``os.replace``: a kill during a save leaves the old one.
2. It resumes after joining the world: rank 0 loads the checkpoint and broadcasts it, so every
   rank starts from the same step even if the ranks start at different times.
3. SIGTERM (a resize, a stop, an eviction) only sets a flag. At each step boundary the ranks
   agree on it with one tiny all-reduce, so all of them stop at the same step; rank 0 saves,
   and each rank exits 0 once it has had its own SIGTERM (an unasked exit 0 means "finished").

Run it under the local launcher (one resize to 1 rank at 8 s, back to 2 at 16 s)::

    elastra-worker local --launch torchrun --schedule 2:0,1:8s,2:16s --checkpoint-dir /tmp/ck \\
        --log /tmp/steps.jsonl -- python examples/torchrun_ddp.py --steps 100 --step-seconds 0.2

or under torchrun itself: ``torchrun --nproc-per-node 2 examples/torchrun_ddp.py``.
With ``$ELASTRA_STEP_LOG`` set, rank 0 appends one JSON line per step
(``step``, ``worldSize``, ``worldVersion``, ``loss``, ``resumedFrom``). With
``$ELASTRA_PROGRESS_FILE`` set (Elastra's torchrun mode), every rank replaces that file with its
step and loss after each step: the job's status and metrics show them. (A script that may
import ``elastra_worker`` calls ``elastra_worker.report_progress(step, loss=...)`` instead.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

CHECKPOINT_NAME = "torchrun_ddp.pt"
_sigterm = False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _sigterm  # noqa: PLW0603  (a signal handler can only talk through module state)
    _sigterm = True


def save_checkpoint(directory: Path, state: dict[str, Any]) -> None:
    """Write ``state`` so that a crash at any moment leaves the previous checkpoint intact."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{CHECKPOINT_NAME}.")
    with os.fdopen(fd, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / CHECKPOINT_NAME)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


def load_checkpoint(directory: Path) -> dict[str, Any] | None:
    """Rank 0 reads the checkpoint and every rank gets a copy (after the world has formed)."""
    box: list[Any] = [None]
    path = directory / CHECKPOINT_NAME
    if dist.get_rank() == 0 and path.exists():
        box[0] = torch.load(path, map_location="cpu", weights_only=True)
    dist.broadcast_object_list(box, src=0)
    state: dict[str, Any] | None = box[0]
    return state


def batch(step: int, *, global_batch: int, rank: int, world: int) -> tuple[torch.Tensor, ...]:
    """This rank's slice of step ``step``'s global batch: the same samples at any world size."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(global_batch, 16, generator=g)
    y = x @ torch.linspace(-1.0, 1.0, 16).unsqueeze(1) + 0.1 * torch.randn(
        global_batch, 1, generator=g
    )
    return torch.tensor_split(x, world)[rank], torch.tensor_split(y, world)[rank]


def trim_step_log(path: Path, start: int) -> None:
    """Drop records of steps at or past ``start``: a resumed run writes them again."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if json.loads(line)["step"] < start]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in keep))
    os.replace(tmp, path)


def agree_to_stop() -> bool:
    """True on every rank if any rank has had SIGTERM (one all-reduce of one number)."""
    flag = torch.tensor([1.0 if _sigterm else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def wait_for_own_sigterm(timeout: float) -> int:
    """Stopped with the others: exit 0 only on our own SIGTERM (an unasked exit 0 means done)."""
    deadline = time.monotonic() + timeout
    while not _sigterm:
        if time.monotonic() > deadline:
            return 75  # the world stopped but nobody told this pod: let the launcher decide
        time.sleep(0.05)
    return 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="total optimizer steps")
    p.add_argument("--step-seconds", type=float, default=0.0, help="pad each step to this long")
    p.add_argument("--checkpoint-every", type=int, default=10, help="also save every N steps")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--peer-stop-wait", type=float, default=120.0,
                   help="seconds to wait for our own SIGTERM after the others stopped")  # fmt: skip
    return p.parse_args()


def restore(ckpt_dir: Path, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Load the newest checkpoint, if any, into ``model`` and ``opt``; the step to start at."""
    state = load_checkpoint(ckpt_dir)
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    return int(state["step"])


def log_step(path: Path | None, record: dict[str, Any]) -> None:
    """Rank 0 appends one JSON line per step (the launcher's --log, when it sets the path)."""
    if path is not None and dist.get_rank() == 0:
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def report_progress(path: Path | None, step: int, loss: float, samples_per_second: float) -> None:
    """Steps done, the last loss and the rate, for Elastra's status and metrics (no Elastra
    import: ``elastra_worker.report_progress`` writes the same file)."""
    if path is not None:
        tmp = path.with_name(f".{path.name}.tmp")
        report = {"step": step, "loss": loss, "samplesPerSecond": samples_per_second}
        tmp.write_text(json.dumps(report))
        os.replace(tmp, path)  # the agent never reads half a report


def main() -> int:
    args = parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # plain `python`: a world of one
    os.environ.setdefault("MASTER_PORT", "29500")
    ckpt_dir = Path(os.environ.get("ELASTRA_CHECKPOINT_DIR", "checkpoints"))
    step_log = Path(os.environ["ELASTRA_STEP_LOG"]) if os.environ.get("ELASTRA_STEP_LOG") else None
    progress = os.environ.get("ELASTRA_PROGRESS_FILE")
    progress_file = Path(progress) if progress else None
    global_batch = int(os.environ.get("ELASTRA_GLOBAL_BATCH_SIZE", "32"))
    version = int(os.environ.get("ELASTRA_WORLD_VERSION", "0"))
    torch.set_num_threads(1)

    # Until the world has formed there is nothing to save: SIGTERM keeps its default (exit).
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    signal.signal(signal.SIGTERM, _on_sigterm)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = restore(ckpt_dir, model, opt)
    ddp = DistributedDataParallel(model)  # also makes every replica equal to rank 0's
    if rank == 0:
        print(f"rank 0/{world}: world version {version}, resuming at step {start}", flush=True)
        if step_log is not None:
            trim_step_log(step_log, start)

    def save(next_step: int) -> None:
        if rank == 0:
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": next_step}
            save_checkpoint(ckpt_dir, state)

    step = start
    while step < args.steps:
        began = time.monotonic()
        x, y = batch(step, global_batch=global_batch, rank=rank, world=world)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP averages the gradients over the ranks
        opt.step()
        log_step(step_log, {"step": step, "worldSize": world, "worldVersion": version,
                            "loss": loss.item(), "resumedFrom": start})  # fmt: skip
        step += 1
        time.sleep(max(0.0, args.step_seconds - (time.monotonic() - began)))
        report_progress(progress_file, step, loss.item(), global_batch / (time.monotonic() - began))
        if agree_to_stop():
            save(step)
            dist.barrier()  # nobody leaves before the checkpoint is on disk
            dist.destroy_process_group()
            return wait_for_own_sigterm(args.peer_stop_wait)
        if step % args.checkpoint_every == 0:
            save(step)
    save(step)  # finished: a restart finds nothing left to do
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
