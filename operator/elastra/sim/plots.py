"""PNG plots of simulation results: JCT CDF per policy and GPU allocation over time.

matplotlib is imported here only (a ``dev`` extra, not an operator dependency), with the Agg
backend, so plotting works without a display and the rest of ``elastra.sim`` never needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from elastra.errors import UserError
from elastra.sim.metrics import SimResult


def write_plots(results: Sequence[SimResult], directory: Path) -> tuple[Path, Path]:
    """Write ``jct_cdf.png`` and ``utilization.png`` into ``directory``; their paths."""
    # Imported here: matplotlib is optional (the dev extra), the operator never needs it.
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError:
        raise UserError(
            "--plots: matplotlib is not installed (pip install 'elastra[dev]' or matplotlib)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--plots: cannot create {directory}: {err.strerror}") from None

    cdf_path = directory / "jct_cdf.png"
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    for result in results:
        hours = sorted(j / 3600.0 for j in result.jcts)
        fractions = [(i + 1) / len(hours) for i in range(len(hours))]
        axes.step(hours, fractions, where="post", label=f"{result.policy}")
    axes.set_xscale("log")
    axes.set_xlabel("job completion time (hours, log scale)")
    axes.set_ylabel("fraction of jobs")
    axes.set_title("JCT CDF per policy")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(cdf_path)
    plt.close(figure)

    util_path = directory / "utilization.png"
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    for result in results:
        if not result.timeline or result.cluster_gpus == 0:
            continue
        times = [t / 3600.0 for t, _ in result.timeline] + [result.makespan_s / 3600.0]
        shares = [g / result.cluster_gpus for _, g in result.timeline]
        shares.append(shares[-1])
        axes.step(times, shares, where="post", label=f"{result.policy}", linewidth=1)
    axes.set_xlabel("time since trace start (hours)")
    axes.set_ylabel("GPUs allocated (fraction of cluster)")
    axes.set_ylim(0, 1.05)
    axes.set_title("GPU utilisation over time")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(util_path)
    plt.close(figure)
    return cdf_path, util_path
