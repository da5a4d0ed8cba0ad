"""A standby trainer: a Python process that has already imported torch, waiting for its world.

Most of a resize is spent starting Python and importing torch (5-12 s on a loaded machine, more
than stopping, checkpointing and loading together). The agent keeps one standby per local
trainer ready while the current world trains; when the next world version starts, it sends each
standby the trainer's environment and command on stdin, and the standby runs the training
script in-process, as ``python script.py ARGS`` or ``python -m module ARGS`` would.

Only commands that run a script or module with the agent's own interpreter are warm-started
(``warm_command`` decides); anything else is started cold, as a new process.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from .assignment import session_env
from .control import mark_warm
from .cpushare import requested_threads
from .lifeline import arm_from_env
from .session.rerun import RERUN_ENV, WorldMoved
from .torchrun import check_pod_gpus

PRELOAD = (
    "torch",
    "torch._dynamo",  # DDP's constructor imports it lazily: about 2 s of a resize
    "torch.distributed.checkpoint.state_dict",
    "torch.nn.parallel",
    "elastra_worker.api",
)


def warm_command(command: Sequence[str]) -> list[str] | None:
    """``[script, args...]`` or ``["-m", module, args...]`` if ``command`` can run warm."""
    if len(command) < 2 or not Path(command[0]).name.startswith("python"):
        return None
    found = shutil.which(command[0])
    # The same bin directory means the same interpreter and the same virtual environment.
    if found is None or Path(found).absolute().parent != Path(sys.executable).absolute().parent:
        return None
    if command[1] == "-m" and len(command) >= 3:
        return list(command[1:])
    if command[1].startswith("-") or not command[1].endswith(".py"):
        return None
    return list(command[1:])


def _preload() -> None:
    """Import what every trainer imports; CUDA is not initialised (no device is touched)."""
    for name in PRELOAD:
        importlib.import_module(name)


def main() -> None:
    """Preload, wait for one JSON line ``{"env": {...}, "argv": [...]}``, run the script:
    again, in the next world, each time it ends by moving there (``session/rerun.py``)."""
    arm_from_env()
    _preload()
    mark_warm()  # the pod's startup probe passes once its standbys are here (Agent.warm)
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)  # the agent no longer needs us
    order = json.loads(line)
    os.environ.clear()
    os.environ.update(order["env"])
    threads = requested_threads(os.environ)
    if threads is not None:  # torch read the variable at import, before the order came
        importlib.import_module("torch").set_num_threads(threads)
    check_pod_gpus(os.environ)  # torchrun mode's check (a Session checks for itself)
    argv: list[str] = order["argv"]
    sys.stdin.close()
    os.environ[RERUN_ENV] = "1"
    while True:
        try:
            _run(argv)
            return
        except WorldMoved as moved:  # the script runs again, in the next world
            os.environ.update(session_env(moved.assignment, moved.local_rank))
            del moved  # its traceback holds the old run's frames: the old model
            gc.collect()


def _run(argv: list[str]) -> None:
    """Run the script or module as ``python ARGV`` would."""
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(argv[0])
        sys.argv = [script, *argv[1:]]
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
