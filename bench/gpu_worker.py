"""GPU benchmark of the worker runtime: NCCL training steps and a 1B-parameter checkpoint.

Not part of ``make bench`` (its name does not start with ``bench_``): run it by hand on a machine
with a GPU, ``python bench/gpu_worker.py``; it prints "skipped" and exits 0 where there is none.
It stays under five minutes on one GPU:

1. The reference trainer (``python -m elastra_worker.train``, ~140M parameters, 1k tokens)
   under the local launcher on one GPU with NCCL (dp=1), with one world change half way
   (schedule ``1:0,1:40``): step time and the restart overhead in steps.
2. A 1B-parameter bf16 state on the GPU saved with ``Checkpointer`` (DCP + sha256 + commit) and
   loaded back, as ratios to the raw sequential write/read of the same disk in the same run.

Environment: ``BENCH_GPU_PARAMS`` (default 1e9), ``BENCH_DIR`` (default: a temp dir).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
CHUNK = 64 << 20


GPU_MODEL = (
    "{layers: 8, hiddenSize: 1024, ffnHiddenSize: 2816, attentionHeads: 16, kvHeads: 8, "
    "vocabSize: 32000, sequenceLength: 1024}\n"
)
"""The reference trainer's model for the GPU run: about 140M parameters, 1k-token sequences."""


def training_steps(work: Path) -> None:
    """The reference trainer on the GPU through the launcher; print step time, restart cost."""
    log = work / "steps.jsonl"
    model = work / "model.yaml"
    model.write_text(GPU_MODEL)
    cmd = [
        sys.executable, "-m", "elastra_worker.cli", "local", "--schedule", "1:0,1:40",
        "--steps", "80", "--checkpoint-dir", str(work / "ckpt"), "--log", str(log),
        "--global-batch-size", "16", "--micro-batch-size", "4", "--world-timeout", "300",
        "--", sys.executable, "-m", "elastra_worker.train", "--model", str(model),
    ]  # fmt: skip
    arrivals: dict[int, float] = {}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = 0
    while proc.poll() is None:
        if log.exists():
            lines = log.read_text().splitlines()
            for line in lines[seen:]:
                arrivals.setdefault(int(json.loads(line)["step"]), time.time())
            seen = len(lines)
        time.sleep(0.002)
    if proc.returncode != 0:
        print("  training run failed:", (proc.stderr.read() if proc.stderr else "")[-2000:])
        return
    steps = sorted(arrivals)
    gaps = [arrivals[s] - arrivals[s - 1] for s in steps[2:] if s not in (40, 41)]
    step_s = statistics.median(gaps)
    restart = arrivals[40] - arrivals[39] - step_s
    print(f"  NCCL, reference model (140M), 1 GPU dp=1: step {step_s * 1000:.1f} ms (16 x 1024)")
    print(f"  world change 1 -> 1: {restart:.2f} s = {restart / step_s:.0f} steps")


def raw_io(path: Path, nbytes: int) -> tuple[float, float]:
    """Seconds to write (with fsync) and to read back ``nbytes`` sequentially."""
    buf = os.urandom(CHUNK)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(nbytes // CHUNK):
            f.write(buf)
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(CHUNK):
            pass
    read_s = time.perf_counter() - t0
    path.unlink()
    return write_s, read_s


def checkpoint_1b(work: Path, params: int) -> None:
    """Save and load a ``params``-parameter bf16 state living on the GPU."""
    from elastra_worker.checkpoint import Checkpointer  # noqa: PLC0415 (after the GPU check)
    from elastra_worker.launcher import free_port  # noqa: PLC0415
    from elastra_worker.layout import CheckpointRoot  # noqa: PLC0415

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
        timeout=timedelta(seconds=600),
    )  # fmt: skip
    try:
        n = 128
        per = params // n
        state = {
            f"layer{i}.weight": torch.randn(per, device="cuda", dtype=torch.bfloat16)
            for i in range(n)
        }
        nbytes = per * n * 2
        raw_w, raw_r = raw_io(work / "raw.bin", nbytes)
        root = CheckpointRoot(work / "ckpt-1b", job="bench")
        ckpt = Checkpointer(root, group=None, world_version=1, keep=1, thread_count=8)
        saved = ckpt.save(dict(state), step=1, extra={})
        target = {k: torch.empty_like(v) for k, v in state.items()}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        manifest = ckpt.find_loadable()
        assert manifest is not None
        ckpt.load(target, manifest)
        torch.cuda.synchronize()
        load_s = time.perf_counter() - t0
        ok = all(torch.equal(target[k], state[k]) for k in state)
        gb = nbytes / 1e9
        print(f"  {params / 1e9:.1f}B-parameter bf16 state ({gb:.1f} GB) on the GPU:")
        print(f"    raw write {gb / raw_w:.2f} GB/s, raw read {gb / raw_r:.2f} GB/s")
        print(
            f"    save {gb / saved.seconds:.2f} GB/s (ratio {raw_w / saved.seconds:.2f}),"
            f" verified load {gb / load_s:.2f} GB/s (ratio {raw_r / load_s:.2f}),"
            f" round trip exact: {ok}"
        )
    finally:
        dist.destroy_process_group()


def main() -> int:
    """Run both parts; skip cleanly without a GPU."""
    if not torch.cuda.is_available():
        print("gpu_worker: skipped (no CUDA device)")
        return 0
    work = Path(os.environ.get("BENCH_DIR") or tempfile.mkdtemp(prefix="elastra-gpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"gpu_worker on {torch.cuda.get_device_name(0)}, disk under {work}")
    try:
        training_steps(work)
        checkpoint_1b(work, int(float(os.environ.get("BENCH_GPU_PARAMS", "1e9"))))
    finally:
        if not os.environ.get("BENCH_DIR"):
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
