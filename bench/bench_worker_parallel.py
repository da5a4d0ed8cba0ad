"""Elastra's runtime overhead on a parallel plan, and the cost of a reshard, as ratios in one run.

1. **Step time against a plain script.** The same model (the reference transformer), the same
   mesh and the same PyTorch building blocks (DTensor tensor parallelism, FSDP2), the same
   batches: once as a plain ``torchrun`` loop (forward, backward, AdamW step, nothing else) and
   once through ``Session`` + ``build_parallel`` (what ``python -m elastra_worker.train`` runs:
   loss weighting, the per-step vote, progress accounting; no checkpoint inside the timed
   steps). Runs alternate (plain, elastra, plain, elastra) so a shared machine's noise moves
   both; the ratio is elastra's median step over plain's. Target: <= 1.05.
2. **Reshard against the raw disk.** A checkpoint saved under dp=2 is loaded under tp=2
   (every tensor resharded); the load time is compared with reading the same bytes from the
   same disk sequentially (page cache dropped where permitted, else both warm).

Prints one JSON line. Environment: ``BENCH_STEPS`` (default 30), ``BENCH_HIDDEN`` (256).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from elastra_worker.launcher import free_ports

REPO = Path(__file__).resolve().parents[1]
WORLD = 2


def model_config(hidden: int) -> Any:
    from elastra_worker.models.llama import ModelConfig  # noqa: PLC0415 - child processes only

    return ModelConfig(
        layers=4,
        hidden_size=hidden,
        ffn_hidden_size=hidden * 3,
        attention_heads=8,
        kv_heads=4,
        vocab_size=2048,
        sequence_length=128,
    )


def plain(args: argparse.Namespace) -> list[float]:
    """A torchrun script written with the same building blocks, nothing of Elastra's runtime."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

    from elastra_worker.models.llama import (  # noqa: PLC0415
        Transformer,
        init_weights,
        loss_fn,
        make_batch,
    )
    from elastra_worker.parallel.tensor import apply_tensor_parallel  # noqa: PLC0415

    dist.init_process_group("gloo")
    cfg = model_config(args.hidden)
    model = Transformer(cfg)
    init_weights(model, 0)
    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
    apply_tensor_parallel(model, mesh["tp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for step in range(args.steps):
        start = time.perf_counter()
        tokens, targets = make_batch(range(step * 8, step * 8 + 8), cfg, 0)
        for i in range(0, 8, 2):
            (loss_fn(model(tokens[i : i + 2]), targets[i : i + 2]) / 4).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    dist.destroy_process_group()
    return times


def elastra(args: argparse.Namespace) -> list[float]:
    """The same loop through Session and build_parallel (the reference trainer's path)."""
    import torch  # noqa: PLC0415

    from elastra_worker.api import Session  # noqa: PLC0415
    from elastra_worker.assignment import parse_assignment  # noqa: PLC0415
    from elastra_worker.models.llama import make_batch  # noqa: PLC0415
    from elastra_worker.parallel_model import build_parallel, llama_recipe  # noqa: PLC0415

    cfg = model_config(args.hidden)
    rank = int(os.environ["RANK"])
    assignment = parse_assignment(
        {
            "job": "bench", "worldVersion": 1, "rank": rank, "worldSize": WORLD,
            "masterAddr": "127.0.0.1", "masterPort": args.store_port,
            "plan": {"dp": 1, "tp": WORLD, "microBatchSize": 2},
            "globalBatchSize": 8, "consistency": "data",
            "checkpoint": {"path": args.checkpoint_dir, "intervalSeconds": 0},
        }
    )  # fmt: skip
    times: list[float] = []
    with Session(assignment, device=torch.device("cpu")) as sess:
        model = build_parallel(sess, llama_recipe(cfg))
        opts = [torch.optim.AdamW(p.parameters(), lr=1e-3) for p in model.parts]
        sess.restore(model.parts, opts)
        start = time.perf_counter()
        for batch in sess.batches(dataset_size=1 << 20, total_steps=args.steps):
            model.train_step(batch, lambda s: make_batch(s, cfg, 0))
            sess.step(opts)
            now = time.perf_counter()
            times.append(now - start)
            start = now
    return times


def reshard(args: argparse.Namespace) -> dict[str, float]:
    """Save under dp=2, load under tp=2 (timed), then read the same files raw (timed)."""
    import torch  # noqa: PLC0415

    from elastra_worker.api import Session  # noqa: PLC0415
    from elastra_worker.assignment import parse_assignment  # noqa: PLC0415
    from elastra_worker.models.llama import make_batch  # noqa: PLC0415
    from elastra_worker.parallel_model import build_parallel, llama_recipe  # noqa: PLC0415

    cfg = model_config(args.hidden * 2)
    rank = int(os.environ["RANK"])
    out: dict[str, float] = {}
    for version, plan in ((1, {"dp": WORLD}), (2, {"dp": 1, "tp": WORLD})):
        assignment = parse_assignment(
            {
                "job": "bench", "worldVersion": version, "rank": rank, "worldSize": WORLD,
                "masterAddr": "127.0.0.1",
                "masterPort": args.store_port + version,
                "plan": {"microBatchSize": 2, **plan}, "globalBatchSize": 8,
                "checkpoint": {"path": args.checkpoint_dir, "intervalSeconds": 0},
            }
        )  # fmt: skip
        with Session(assignment, device=torch.device("cpu")) as sess:
            model = build_parallel(sess, llama_recipe(cfg))
            opts = [torch.optim.AdamW(p.parameters(), lr=1e-3) for p in model.parts]
            start = time.perf_counter()
            sess.restore(model.parts, opts)
            out["loadS" if version == 2 else "firstLoadS"] = time.perf_counter() - start
            if version == 1:  # one step (AdamW state exists), saved when the world is done
                for batch in sess.batches(dataset_size=1 << 20, total_steps=1):
                    model.train_step(batch, lambda s: make_batch(s, cfg, 0))
                    sess.step(opts)
    files = [p for p in Path(args.checkpoint_dir).rglob("*") if p.is_file()]
    start = time.perf_counter()
    size = 0
    for path in files[rank::WORLD]:
        with open(path, "rb") as f:
            while chunk := f.read(16 << 20):
                size += len(chunk)
    out["rawReadS"] = time.perf_counter() - start
    out["bytes"] = float(size)
    return out


def child(argv: list[str]) -> int:
    """One torchrun rank: run the mode and print its figures (rank 0)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["plain", "elastra", "reshard"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--checkpoint-dir", default="")
    parser.add_argument("--store-port", type=int, default=0)
    args = parser.parse_args(argv)
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    result: Any = {"plain": plain, "elastra": elastra, "reshard": reshard}[args.mode](args)
    if int(os.environ["RANK"]) == 0:
        print("RESULT " + json.dumps(result), flush=True)
    return 0


def store_ports() -> int:
    """The first of three free ports below the ephemeral range (gloo's own sockets live there,
    and a store port picked among them was sometimes taken: the run aborted)."""
    return free_ports(3)


def run(mode: str, work: Path, steps: int, hidden: int) -> Any:
    ckpt = work / f"ck-{mode}-{time.monotonic_ns()}"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={WORLD}", __file__, "--child", mode, f"--steps={steps}",
        f"--hidden={hidden}", f"--checkpoint-dir={ckpt}", f"--store-port={store_ports()}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ELASTRA_METRICS_PORT": "0"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    if out.returncode != 0:
        raise SystemExit(f"bench_worker_parallel {mode} failed:\n{out.stderr[-3000:]}")
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    shutil.rmtree(ckpt, ignore_errors=True)
    return json.loads(line.removeprefix("RESULT "))


def main() -> int:
    """Alternate plain and Elastra runs, then the reshard; print one JSON line."""
    steps = int(os.environ.get("BENCH_STEPS", "30"))
    hidden = int(os.environ.get("BENCH_HIDDEN", "256"))
    warm = 5  # first steps: allocation, shape inference
    medians: dict[str, list[float]] = {"plain": [], "elastra": []}
    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as tmp:
        for _ in range(2):
            for mode in ("plain", "elastra"):
                medians[mode].append(statistics.median(run(mode, Path(tmp), steps, hidden)[warm:]))
        moved = run("reshard", Path(tmp), 1, hidden)
    plain_s, elastra_s = min(medians["plain"]), min(medians["elastra"])
    print(
        json.dumps(
            {
                "bench": "worker_parallel",
                "plan": f"dp1tp{WORLD}",
                "plainStepSeconds": round(plain_s, 5),
                "elastraStepSeconds": round(elastra_s, 5),
                "ratioElastraToPlain": round(elastra_s / plain_s, 3),
                "reshardBytes": int(moved["bytes"]),
                "reshardLoadSeconds": round(moved["loadS"], 3),
                "rawReadSeconds": round(moved["rawReadS"], 3),
                "ratioReshardToRawRead": round(moved["loadS"] / max(moved["rawReadS"], 1e-9), 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2:]))
    sys.path.insert(0, str(REPO / "worker_image"))
    sys.exit(main())
