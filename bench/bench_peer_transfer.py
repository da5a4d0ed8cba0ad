"""Peer transfer: a state of about 1 GiB sent from one rank to another over gloo on loopback,
against the same run's raw loopback TCP throughput.

Why: a trainer entering a world should take the state from a peer that holds it in memory
instead of reading the checkpoint back from the volume (``elastra_worker.session.peers``). The
figure that says whether the transfer is worth building on is its throughput as a fraction of
what one TCP connection carries on this machine, measured in the same run: a ratio, not a
pass/fail time.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench_worker_resize import loopback_throughput  # bench/ is the script's own folder
from elastra_worker.launcher import free_port
from elastra_worker.session.peers import share_state

TENSOR_BYTES = 16 * 2**20


def _rank(rank: int, world: int, port: int, total: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=300),
    )  # fmt: skip
    try:
        count = max(1, total // TENSOR_BYTES)
        mine = {  # the source's values; the receiver's own tensors of the same layout, zeros
            f"t{i}": torch.full((TENSOR_BYTES // 4,), float(i) if rank == 0 else 0.0)
            for i in range(count)
        }
        share_state(mine, src=0)  # warm-up: connections, allocator
        moved = share_state(mine, src=0)
        ok = all(bool((t == float(i)).all()) for i, t in enumerate(mine.values()))
        out.put((rank, moved.bytes, moved.seconds, ok))
    finally:
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    """Print the transfer's throughput and its ratio to loopback TCP; never pass/fail on time."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0, help="state size in GiB (default 1)")
    args = p.parse_args(argv)
    total = int(args.gib * 2**30)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    loopback = loopback_throughput()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, total, out)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = sorted(out.get(timeout=600) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    _, moved, seconds, ok = results[1]
    rate = moved / seconds
    print(f"peer transfer, {moved / 2**30:.2f} GiB from rank 0 to rank 1 over gloo (loopback)")
    print(f"  loopback TCP, one connection: {loopback / 2**30:.2f} GiB/s")
    ratio = rate / loopback
    print(f"  share_state: {seconds:.2f} s = {rate / 2**30:.2f} GiB/s = {ratio:.2f}x loopback")
    print(f"  received intact: {ok}")
    return 0 if ok and all(r[3] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
