"""Run a function on every rank of a small gloo world on 127.0.0.1, with a deadline.

Used by the parallelism tests: each rank is a spawned process with one intra-op thread (the
test machines are shared); a rank's exception fails the test with that rank's traceback, and
a world that does not finish by the deadline is killed and fails the test (no fixed sleeps).
"""

from __future__ import annotations

import functools
import os
import pickle
import queue
import time
import traceback
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from elastra_worker.launcher import free_port
from elastra_worker.models.llama import ModelConfig

__all__ = ["TINY", "assert_tensors_close", "free_port", "run_world"]

TINY = ModelConfig(
    layers=4,
    hidden_size=32,
    ffn_hidden_size=64,
    attention_heads=4,
    kv_heads=2,
    vocab_size=97,
    sequence_length=16,
)
"""The model every parallelism test uses: GQA, an odd vocabulary, four layers."""


def _rank_main(job: tuple[Callable[..., Any], tuple[Any, ...]], rank: int, world: int,
               port: int | None, out: Any) -> None:  # fmt: skip
    fn, args = job
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        if port is not None:
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=60),
            )
        # Pickled here, by value: a tensor put on a torch queue as it is travels as a handle
        # to this process's shared memory, which is gone if this process exits before the
        # parent reads it (FileNotFoundError in the parent, seen in a run).
        out.put((rank, None, pickle.dumps(fn(rank, world, *args))))
    except BaseException:  # report everything, the parent decides
        out.put((rank, traceback.format_exc(), None))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_world(
    fn: Callable[..., Any], world: int, *args: Any, timeout: float = 90, form_world: bool = True
) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` ranks; their return values in rank order.

    ``fn`` must be a module-level function (spawned processes import it by name). With
    ``form_world=False`` the ranks join no process group first: ``fn`` forms its own (a
    ``Session``, as in a pod), and no second gloo mesh is formed and torn down for nothing.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port() if form_world else None
    procs = [
        ctx.Process(target=_rank_main, args=((fn, args), r, world, port, out), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"world of {world} did not finish within {timeout}s")
            try:
                rank, error, value = out.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead and len(results) < world and out.empty():
                    pytest.fail(f"a rank died without a report (exit codes {dead})")
                continue
            if error is not None:
                pytest.fail(_failure_report(out, rank, error))
            results[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]


def _failure_report(out: Any, rank: int, error: str, wait_s: float = 10.0) -> str:
    """The first failure and the other ranks' reports that follow within ``wait_s``.

    Why: the first report is often a symptom (a peer closed its connection) of another rank's
    failure; the root cause is in the others' tracebacks.
    """
    lines = [f"rank {rank} failed first:\n{error}"]
    until = time.monotonic() + wait_s
    while (left := until - time.monotonic()) > 0:
        try:
            other, other_error, _ = out.get(timeout=left)
        except queue.Empty:
            break
        lines.append(f"rank {other}: " + (f"failed:\n{other_error}" if other_error else "ok"))
    return "\n".join(lines)


def _prefixed(prefix: str, message: str) -> str:
    return f"{prefix}: {message}"


def assert_tensors_close(
    got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor], label: str
) -> None:
    """Same names, and every tensor close (fp32 noise) to the reference; says which one is not."""
    assert sorted(got) == sorted(want), f"{label}: names differ"
    for name, value in want.items():
        msg = functools.partial(_prefixed, f"{label} {name}")
        torch.testing.assert_close(got[name], value, msg=msg)
