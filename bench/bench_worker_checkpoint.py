"""Checkpoint write throughput as a ratio to the raw sequential write of the same disk, and the
time a save blocks training as a ratio to an in-memory copy of the same state.

All figures come from one run on one disk, interleaved (raw, then each checkpoint variant, then
raw again), so a shared machine's noise moves numerator and denominator together. Every write is
fsynced: a checkpoint that is not on the disk is not a checkpoint. The variants:

- ``dcp tN``: torch.distributed.checkpoint alone with ``FileSystemWriter(thread_count=N)``.
- ``elastra tN``: ``Checkpointer.save``, what a training job pays: DCP + sha256 of every file +
  manifest + atomic commit + directory fsyncs.

Blocking time, interleaved the same way (copy, asynchronous save, synchronous save; median of
``BENCH_CKPT_REPEATS``, default 5):

- ``in-memory copy``: every tensor of the state cloned (the floor for a save that must not see
  the training thread's later updates).
- ``asynchronous``: ``Checkpointer.save_async`` until it returns (the state staged to host
  memory; a thread writes and commits it), and how long that thread then took.
- ``synchronous``: ``Checkpointer.save``, which blocks until the commit.

The same through a ``Session`` (what a training loop pays: the model's and AdamW's state dicts
assembled, RNG and user state packed, then staged): a model whose parameters and AdamW moments
come to about the same size, ``sess.save_checkpoint(wait=False)`` (a periodic save) against
``sess.save_checkpoint()`` (the blocking one a stop takes) and a clone of every tensor of the
model and optimizer.

Environment: ``BENCH_CKPT_MIB`` (state size, default 512), ``BENCH_DIR`` (default: a temp dir
under /tmp, i.e. the disk checkpoints would land on in the local tests).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from elastra_worker.api import Session
from elastra_worker.assignment import assignment_from_env
from elastra_worker.checkpoint import Checkpointer
from elastra_worker.launcher import free_port
from elastra_worker.layout import CheckpointRoot

CHUNK = 8 << 20


def raw_write(path: Path, nbytes: int) -> float:
    """Seconds to write ``nbytes`` sequentially in 8 MiB chunks and fsync."""
    buf = os.urandom(CHUNK)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(nbytes // CHUNK):
            f.write(buf)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return seconds


def make_state(nbytes: int) -> dict[str, torch.Tensor]:
    """A model-like state: 64 float32 tensors of random data (incompressible)."""
    n = 64
    per = nbytes // n // 4
    gen = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(per, generator=gen) for i in range(n)}


def blocking_times(state: dict[str, torch.Tensor], base: Path, repeats: int) -> dict[str, float]:
    """Median seconds of each way to take the state out of training's hands (see above)."""
    root = CheckpointRoot(base / "blocking", job="bench")
    ckpt = Checkpointer(root, group=None, world_version=1, keep=1, thread_count=4)
    group = dist.new_group(backend="gloo")
    assert isinstance(group, dist.ProcessGroup)
    times: dict[str, list[float]] = {"copy": [], "async": [], "background": [], "sync": []}
    step = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        copy = {k: v.clone() for k, v in state.items()}
        times["copy"].append(time.perf_counter() - t0)
        del copy
        step += 1
        t0 = time.perf_counter()
        ckpt.save_async(state, step=step, extra={}, group=group)
        times["async"].append(time.perf_counter() - t0)
        result = ckpt.wait()
        assert result is not None and result.step == step
        times["background"].append(result.seconds)
        step += 1
        t0 = time.perf_counter()
        ckpt.save(state, step=step, extra={})
        times["sync"].append(time.perf_counter() - t0)
    shutil.rmtree(root.path)
    return {name: statistics.median(values) for name, values in times.items()}


def _train_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor a checkpoint of ``model`` and ``opt`` holds."""
    moments = [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    return [*model.parameters(), *moments]


def session_blocking_times(nbytes: int, base: Path, repeats: int) -> dict[str, float]:
    """Median seconds of a Session's periodic (background) and blocking saves, and a copy."""
    width = 2048
    layers = max(1, nbytes // 3 // (width * width * 4))  # parameters + AdamW's two moments
    env = {
        "ELASTRA_CHECKPOINT_DIR": str(base / "session"),
        "MASTER_PORT": str(free_port()),
        "ELASTRA_GLOBAL_BATCH_SIZE": "1",
        "ELASTRA_MICRO_BATCH_SIZE": "1",
    }
    times: dict[str, list[float]] = {"copy": [], "async": [], "sync": []}
    with Session(assignment_from_env(env), device=torch.device("cpu")) as sess:
        net = torch.nn.Sequential(
            *(torch.nn.Linear(width, width, bias=False) for _ in range(layers))
        )
        model = sess.prepare(net)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        sess.restore(model, opt)
        for batch in sess.batches(dataset_size=1 << 20, total_steps=2 * repeats + 1):
            for micro in batch:
                with micro.sync(model):
                    micro.backward(model(torch.ones(1, width)).square().mean())
            sess.step(opt)
            if batch.step == 2 * repeats:
                continue  # the last step ends in the stop's save: not measured
            t0 = time.perf_counter()
            copy = [t.detach().clone() for t in _train_state(model, opt)]
            times["copy"].append(time.perf_counter() - t0)
            del copy
            sess.wait_for_checkpoint()  # the previous save is not this one's blocking time
            wait = batch.step % 2 == 1
            t0 = time.perf_counter()
            sess.save_checkpoint(wait=wait)
            times["sync" if wait else "async"].append(time.perf_counter() - t0)
    shutil.rmtree(base / "session")
    return {name: statistics.median(values) for name, values in times.items()}


def print_blocking(mib: int, repeats: int, t: dict[str, float], how: str = "Checkpointer") -> None:
    print(f"checkpoint blocking time, {how}, {mib} MiB, one rank (median of {repeats})")
    print(f"  in-memory copy of the state: {t['copy']:6.3f} s")
    print(
        f"  asynchronous save, blocking: {t['async']:6.3f} s  ratio to the copy "
        f"{t['async'] / t['copy']:5.2f} (target <= 2)"
        + (
            f"; its thread wrote and committed it in {t['background']:.2f} s"
            if "background" in t
            else ""
        )
    )
    print(
        f"  synchronous save, blocking:  {t['sync']:6.3f} s  ratio to the copy "
        f"{t['sync'] / t['copy']:5.2f}"
    )


def main() -> int:
    """Print throughput and blocking-time ratios; never pass/fail on time."""
    mib = int(os.environ.get("BENCH_CKPT_MIB", "512"))
    repeats = int(os.environ.get("BENCH_CKPT_REPEATS", "5"))
    nbytes = mib << 20
    base = Path(os.environ.get("BENCH_DIR") or tempfile.mkdtemp(prefix="elastra-bench-ckpt-"))
    base.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=300),
    )
    state = make_state(nbytes)
    raws: list[float] = []
    results: list[tuple[str, float]] = []
    try:
        raws.append(raw_write(base / "raw.bin", nbytes))
        for threads in (1, 2, 4):
            target = base / f"dcp-t{threads}"
            t0 = time.perf_counter()
            dcp_save(state, storage_writer=FileSystemWriter(target, thread_count=threads))
            results.append((f"dcp t{threads}", time.perf_counter() - t0))
            shutil.rmtree(target)
            raws.append(raw_write(base / "raw.bin", nbytes))
        for threads in (1, 2, 4):
            root = CheckpointRoot(base / f"elastra-t{threads}", job="bench")
            ckpt = Checkpointer(root, group=None, world_version=1, keep=1, thread_count=threads)
            result = ckpt.save(dict(state), step=1, extra={})
            results.append((f"elastra t{threads}", result.seconds))
            shutil.rmtree(root.path)
            raws.append(raw_write(base / "raw.bin", nbytes))
        blocking = blocking_times(state, base, repeats)
    finally:
        dist.destroy_process_group()
    del state
    try:
        in_session = session_blocking_times(nbytes, base, repeats)
    finally:
        if not os.environ.get("BENCH_DIR"):
            shutil.rmtree(base, ignore_errors=True)
    raw_s = statistics.median(raws)
    print(f"checkpoint write, {mib} MiB, fsynced, one rank, disk under {base.parent}")
    print(f"  raw sequential write: {nbytes / raw_s / 1e6:8.1f} MB/s (median of {len(raws)})")
    for name, seconds in results:
        print(
            f"  {name:<12} {nbytes / seconds / 1e6:8.1f} MB/s  ratio to raw {raw_s / seconds:5.2f}"
        )
    best = max(raw_s / s for name, s in results if name.startswith("elastra"))
    print(f"  best elastra ratio: {best:.2f} (target >= 0.7)")
    print_blocking(mib, repeats, blocking)
    print_blocking(mib, repeats, in_session, "through a Session (model + AdamW)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
