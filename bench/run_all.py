"""Run every ``bench/bench_*.py`` in turn; each prints its own ratios.

Benchmarks report ratios measured in one run (against the raw API server, the raw disk, a
static run) because these machines are shared and noisy: absolute times are context, never
a pass/fail threshold. A benchmark that crashes makes ``make bench`` fail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    """Run each benchmark script with this interpreter; return non-zero if any failed."""
    here = Path(__file__).resolve().parent
    only = set(sys.argv[1:])
    failed: list[str] = []
    for script in sorted(here.glob("bench_*.py")):
        if only and script.stem not in only:
            continue
        print(f"==> {script.stem}", flush=True)
        if subprocess.run([sys.executable, str(script)], check=False).returncode != 0:
            failed.append(script.stem)
    if failed:
        print(f"bench: FAILED {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
