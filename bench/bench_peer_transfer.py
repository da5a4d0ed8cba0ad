"""Peer transfer: a state of about 1 GiB sent from one rank to another over gloo on loopback,
against the same run's raw loopback TCP throughput; with ``--device cuda``, between two GPUs
over NCCL as a GPU world sends it, against one raw NCCL broadcast of the same bytes.

Why: a trainer entering a world should take the state from a peer that holds it in memory
instead of reading the checkpoint back from the volume (``elastra_worker.session.peers``). The
figure that says whether the transfer is worth building on is its throughput as a fraction of
what one TCP connection carries on this machine, measured in the same run: a ratio, not a
pass/fail time. ``--device cuda`` needs two GPUs (NCCL refuses two ranks on one GPU) and says
"skipped" without them; ``make bench`` runs the CPU form.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench_worker_resize import loopback_throughput  # bench/ is the script's own folder
from elastra_worker.launcher import free_port
from elastra_worker.session.peers import share_state

TENSOR_BYTES = 16 * 2**20


def _rank(rank: int, port: int, total: int, device: str, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """One of the two ranks: rank 0 sends ``total`` bytes of tensors on ``device``."""
    torch.set_num_threads(1)
    gpu = device == "cuda"
    if gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
        world_size=2, timeout=timedelta(seconds=300),
    )  # fmt: skip
    try:
        # As a GPU world does (checkpoints.py): layouts over a gloo group, CUDA data over NCCL.
        group = dist.new_group(backend="gloo") if gpu else None
        assert group is None or isinstance(group, dist.ProcessGroup)
        world_group = dist.group.WORLD
        assert isinstance(world_group, dist.ProcessGroup)
        routes = {"cuda": world_group} if gpu else None
        count = max(1, total // TENSOR_BYTES)
        mine = {  # the source's values; the receiver's own tensors of the same layout, zeros
            f"t{i}": torch.full((TENSOR_BYTES // 4,), float(i) if rank == 0 else 0.0, device=device)
            for i in range(count)
        }
        share_state(mine, src=0, group=group, device_groups=routes)  # warm-up
        moved = share_state(mine, src=0, group=group, device_groups=routes)
        ok = all(bool((t == float(i)).all()) for i, t in enumerate(mine.values()))
        raw = _raw_broadcast(count * TENSOR_BYTES, device) if gpu else 0.0
        out.put((rank, moved.bytes, moved.seconds, ok, raw))
    finally:
        dist.destroy_process_group()


def _raw_broadcast(nbytes: int, device: str) -> float:
    """Seconds of one broadcast of ``nbytes`` from rank 0 over the default group: what the
    interconnect carries without ``share_state``'s packing."""
    buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dist.broadcast(buffer, src=0)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    dist.broadcast(buffer, src=0)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    """Print the transfer's throughput and its ratio to loopback TCP; never pass/fail on time."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0, help="state size in GiB (default 1)")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu",
        help="cpu: gloo on loopback (default); cuda: NCCL between GPUs 0 and 1",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        print(f"peer transfer over NCCL: skipped ({torch.cuda.device_count()} GPUs, 2 needed)")
        return 0
    total = int(args.gib * 2**30)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    loopback = loopback_throughput() if args.device == "cpu" else 0.0
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, total, args.device, out)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = sorted(out.get(timeout=600) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    _, moved, seconds, ok, raw = results[1]
    rate = moved / seconds
    if args.device == "cuda":
        print(f"peer transfer, {moved / 2**30:.2f} GiB from GPU 0 to GPU 1 over NCCL")
        print(f"  one raw NCCL broadcast of those bytes: {moved / raw / 2**30:.2f} GiB/s")
        baseline = moved / raw
    else:
        print(f"peer transfer, {moved / 2**30:.2f} GiB from rank 0 to rank 1 over gloo (loopback)")
        print(f"  loopback TCP, one connection: {loopback / 2**30:.2f} GiB/s")
        baseline = loopback
    ratio = rate / baseline
    where = "the raw broadcast" if args.device == "cuda" else "loopback"
    print(f"  share_state: {seconds:.2f} s = {rate / 2**30:.2f} GiB/s = {ratio:.2f}x {where}")
    print(f"  received intact: {ok}")
    return 0 if ok and all(r[3] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
