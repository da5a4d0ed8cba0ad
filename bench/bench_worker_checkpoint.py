"""Checkpoint write throughput as a ratio to the raw sequential write of the same disk.

All figures come from one run on one disk, interleaved (raw, then each checkpoint variant, then
raw again), so a shared machine's noise moves numerator and denominator together. Every write is
fsynced: a checkpoint that is not on the disk is not a checkpoint. The variants:

- ``dcp tN``: torch.distributed.checkpoint alone with ``FileSystemWriter(thread_count=N)``.
- ``elastra tN``: ``Checkpointer.save``, what a training job pays: DCP + sha256 of every file +
  manifest + atomic commit + directory fsyncs.

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


def main() -> int:
    """Print throughput ratios; never pass/fail on time."""
    mib = int(os.environ.get("BENCH_CKPT_MIB", "512"))
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
    finally:
        dist.destroy_process_group()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
