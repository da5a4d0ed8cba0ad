"""torchrun compatibility: what a plain DDP script written for ``torchrun`` expects of its launcher.

In ``torchrun`` launch mode (``elastra-worker run --launch torchrun``, ``ELASTRA_LAUNCH=torchrun``
in the container) the agent runs the user's command once per world version with the variables
torchrun sets, so a script that reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and calls
``init_process_group(init_method="env://")`` runs unchanged. What torchrun's elastic agent does
on a membership change, the agent does on a new world version: SIGTERM to the script (its chance
to checkpoint), a grace period, SIGKILL, and a fresh start in the new world, where the script
resumes from its own checkpoint.

Differences from torchrun, on purpose:

- The rank-0 script hosts the c10d store itself (``TORCHELASTIC_USE_AGENT_STORE`` is never set):
  each world version has its own ``MASTER_PORT``, so no key of an older world is ever seen.
- ``TORCHELASTIC_RESTART_COUNT`` counts every world this pod's agent started before, resizes
  included (torchrun counts failures only): a script that resumes only after a restart then
  resumes after a resize too. A pod that joins late starts at 0, so decide by looking for a
  checkpoint, not by this number.

Started cold, the script runs through ``python -m elastra_worker.torchrun CMD...``, which asks
the kernel to kill it with the agent (a plain script cannot arm that itself) and then execs CMD.
In a pod given GPUs (``ELASTRA_POD_GPUS``) it first checks that they are usable
(``devices.require_gpus``) and exits with the permanent code and the one-line reason if not;
a warm start does the same check in ``standby.py``. The script owns its precision: Elastra
passes ``training.precision`` as ``ELASTRA_PRECISION`` and casts nothing itself.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from .assignment import POD_GPUS_ENV, PRECISION_ENV, Assignment, job_checkpoint_uri
from .control import PROGRESS_FILE_ENV
from .layout import job_root, probe_writable
from .lifeline import PARENT_PID_ENV, arm_from_env
from .staging import StagingStore

Launch = Literal["elastra", "torchrun"]
LAUNCHES: tuple[Launch, ...] = ("elastra", "torchrun")
LAUNCH_ENV = "ELASTRA_LAUNCH"
MAX_RESTARTS_ENV = "ELASTRA_MAX_RESTARTS"
DEFAULT_MAX_RESTARTS = 10  # the TrainingJob's default failurePolicy.maxRestarts
CHECKPOINT_DIR_ENV = "ELASTRA_CHECKPOINT_DIR"
CHECKPOINT_URI_ENV = "ELASTRA_CHECKPOINT_URI"
DEFAULT_STAGING = os.path.join(tempfile.gettempdir(), "elastra-checkpoints")
"""Where the staging folder goes when an assignment names only ``checkpoint.uri`` (the operator
always names a path: the pod's checkpoint volume)."""

# Variables of the agent's environment a plain script must not inherit: the agent store flag
# would make rank 0 look for a store nobody hosts; the Session variables would make a script
# that happens to use the Session API take the elastra protocol it is not run under.
_DROPPED = (
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "ELASTRA_ASSIGNMENT_JSON",
    "ELASTRA_CONTROL_DIR",
)


def launch_from_env(environ: Mapping[str, str] = os.environ) -> Launch:
    """``$ELASTRA_LAUNCH`` (default ``elastra``); ValueError for anything else."""
    raw = environ.get(LAUNCH_ENV) or "elastra"
    for launch in LAUNCHES:
        if raw == launch:
            return launch
    raise ValueError(f"${LAUNCH_ENV}: expected one of {', '.join(LAUNCHES)}, got {raw!r}")


def torchrun_env(
    base: Mapping[str, str],
    a: Assignment,
    *,
    local_rank: int,
    restart_count: int,
    progress_file: Path,
) -> dict[str, str]:
    """The environment of local rank ``local_rank`` of world ``a``, as torchrun would set it.

    Plus ``ELASTRA_CHECKPOINT_DIR`` (where to checkpoint: ``checkpoint_dir``), with
    ``checkpoint.uri`` ``ELASTRA_CHECKPOINT_URI`` (the job's own prefix), ``ELASTRA_WORLD_VERSION``,
    ``ELASTRA_GLOBAL_BATCH_SIZE`` (to keep the global batch fixed across world sizes),
    ``ELASTRA_PRECISION`` (``training.precision``: the script applies it) and
    ``ELASTRA_POD_GPUS`` (the pod's GPUs, checked before the script starts) and
    ``ELASTRA_PROGRESS_FILE`` (``progress_file``: where ``control.report_progress`` writes).
    """
    env = {k: v for k, v in base.items() if k not in _DROPPED}
    rank = a.rank + local_rank
    local = a.local_world_size
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(a.world_size),
            "LOCAL_WORLD_SIZE": str(local),
            "GROUP_RANK": str(a.rank // local),
            "GROUP_WORLD_SIZE": str(a.world_size // local),
            "ROLE_NAME": "default",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(a.world_size),
            "MASTER_ADDR": a.master_addr,
            "MASTER_PORT": str(a.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": base.get(MAX_RESTARTS_ENV, str(DEFAULT_MAX_RESTARTS)),
            "TORCHELASTIC_RUN_ID": a.job,
            CHECKPOINT_DIR_ENV: str(checkpoint_dir(a)),
            "ELASTRA_WORLD_VERSION": str(a.world_version),
            "ELASTRA_GLOBAL_BATCH_SIZE": str(a.global_batch_size),
            "ELASTRA_JOB": a.job,
            PRECISION_ENV: a.precision,
            POD_GPUS_ENV: str(a.gpus),
            PARENT_PID_ENV: str(os.getpid()),
            PROGRESS_FILE_ENV: str(progress_file),
        }
    )
    if a.checkpoint.uri:  # the script uploads there itself (fsspec/s3fs are in the image)
        env[CHECKPOINT_URI_ENV] = job_checkpoint_uri(a.checkpoint.uri, a.job)
    return env


def checkpoint_dir(a: Assignment) -> Path:
    """The script's ``$ELASTRA_CHECKPOINT_DIR``: the job's own folder on ``checkpoint.path``,
    the one the Session uses (``layout.job_root``), so jobs sharing a claim never meet. With
    ``checkpoint.uri`` it is on the pod's own volume: a staging folder that the agents keep in
    the object store (``staging_store``)."""
    return job_root(a.checkpoint.path or DEFAULT_STAGING, a.job)


def staging_store(a: Assignment) -> StagingStore | None:
    """Where the agents keep the staging folder of a job with ``checkpoint.uri`` (the job's
    own prefix; ``staging.py``); None for a job on a claim."""
    return StagingStore(job_checkpoint_uri(a.checkpoint.uri, a.job)) if a.checkpoint.uri else None


def prepare_checkpoint_dir(a: Assignment) -> None:
    """Create the job's checkpoint folder and check it takes a durable write, and with
    ``checkpoint.uri`` that the job's prefix takes an object (the Session's probe), before the
    script starts: UnusableRootError (a permanent error: the folder and the errno, the bucket
    or the credentials) or CheckpointError (an object store out of reach: retryable)."""
    probe_writable(checkpoint_dir(a))
    if a.checkpoint.uri:
        from .objectstore import ObjectCheckpointRoot  # noqa: PLC0415 - fsspec: uri jobs only

        ObjectCheckpointRoot(a.checkpoint.uri, job=a.job).probe()


def cold_command(command: list[str]) -> list[str]:
    """``command`` behind this module's exec wrapper (see the module docstring)."""
    return [sys.executable, "-m", "elastra_worker.torchrun", *command]


def check_pod_gpus(environ: Mapping[str, str]) -> None:
    """A pod given GPUs (``ELASTRA_POD_GPUS``) that cannot use them exits here: permanent.

    Only then is torch imported (the agent, which imports this module, never is).
    """
    raw = environ.get(POD_GPUS_ENV, "")
    if not raw.isdigit() or int(raw) == 0:
        return
    from .devices import GpuCheckError, require_gpus  # noqa: PLC0415 - torch, GPU pods only
    from .termination import exit_permanent  # noqa: PLC0415

    try:
        require_gpus(int(raw), environ)
    except GpuCheckError as err:
        exit_permanent(str(err), environ)


def main() -> None:
    """Arm die-with-parent, check the pod's GPUs, then become the user's command (same pid)."""
    argv = sys.argv[1:]
    if not argv:
        print("usage: python -m elastra_worker.torchrun CMD [ARGS...]", file=sys.stderr)
        sys.exit(2)
    arm_from_env()
    check_pod_gpus(os.environ)
    try:
        os.execvp(argv[0], argv)
    except OSError as err:
        print(f"elastra_worker.torchrun: cannot run {argv[0]!r}: {err}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main()
