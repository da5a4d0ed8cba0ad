"""``elastra-worker``: the container entry point (``run``) and the local elastic launcher.

Exit codes are the contract in ``exitcodes``: 0 done or stopped, 2 bad configuration (permanent),
75 retryable (the operator should give the pod a rank in a new world version).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from . import exitcodes
from .agent import IN_MEMORY_RESIZE_ENV, Agent, AgentConfig
from .assignment import (
    DEFAULT_PRECISION,
    PRECISIONS,
    AssignmentError,
    assignment_from_env,
    assignment_path,
)
from .errors import PermanentError
from .faults import Chaos
from .launcher import MAX_FAILED_WORLDS, LaunchError, LocalJob, LocalLauncher, parse_fault
from .lifeline import arm_from_env
from .metrics import DEFAULT_METRICS_PORT, METRICS_PORT_ENV, WorkerCollector, serve
from .push import POD_UID_ENV, PUBLIC_KEY_ENV, PushedAssignments
from .schedule import Segment, check_plans, model_from_command, parse_schedule
from .torchrun import LAUNCH_ENV, LAUNCHES, launch_from_env


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    args = list(argv)
    if "--" not in args:
        return args, []
    i = args.index("--")
    return args[:i], args[i + 1 :]


def _run(args: argparse.Namespace, command: list[str]) -> int:
    arm_from_env()  # started by the local launcher: die with it
    path = assignment_path()
    static = None
    if not path.exists() and os.environ.get("WORLD_SIZE"):
        static = assignment_from_env()  # no operator: torchrun-style variables
    control = Path(args.control_dir or tempfile.mkdtemp(prefix="elastra-control-"))
    # The operator's pushes (push.py), signed for this pod, only where a file can fall behind.
    pod_uid = os.environ.get(POD_UID_ENV)
    pushes = None
    if pod_uid and not static:
        pushes = PushedAssignments(os.environ.get(PUBLIC_KEY_ENV), pod_uid)
    agent = Agent(
        AgentConfig(
            command=command,
            control_dir=control,
            assignment_file=None if static else path,
            static_assignment=static,
            stop_timeout_s=args.stop_timeout,
            grace_s=args.grace,
            state_file=Path(args.state_file) if args.state_file else None,
            warm_start=os.environ.get("ELASTRA_WARM_START", "1") != "0",
            in_memory_resize=os.environ.get(IN_MEMORY_RESIZE_ENV, "1") != "0",
            launch=args.launch or launch_from_env(),
            pushed=pushes,
        )
    )
    port = int(os.environ.get(METRICS_PORT_ENV) or DEFAULT_METRICS_PORT)
    if port:
        collector = WorkerCollector(lambda: agent.control.progress(0), lambda: agent.state)
        serve(port, collector, warm=lambda: agent.warm, pushes=pushes)
    return agent.run()


def _local_schedule(args: argparse.Namespace, command: list[str]) -> list[Segment]:
    """The parsed and checked schedule; ValueError (exit 2) before anything starts."""
    torchrun = args.launch == "torchrun"
    if args.steps is None and not torchrun:
        raise ValueError("--steps is required (the last world stops there)")
    if torchrun and (args.fail or args.fail_in_save or args.chaos):
        raise ValueError(
            "--fail, --fail-in-save and --chaos need a Session script, not --launch torchrun"
        )
    if args.chaos:
        Chaos.parse(args.chaos)  # a bad value: exit 2 before anything starts
    if args.max_failed_worlds < 0:
        raise ValueError(f"--max-failed-worlds {args.max_failed_worlds}: must be 0 or more")
    schedule = parse_schedule(args.schedule, args.steps, by_time_only=torchrun)
    check_plans(
        schedule,
        global_batch=args.global_batch_size,
        micro_batch=args.micro_batch_size,
        consistency=args.consistency,
        model=model_from_command(command),
    )
    return schedule


def _local(args: argparse.Namespace, command: list[str]) -> int:
    job = LocalJob(
        command=command,
        schedule=_local_schedule(args, command),
        steps=args.steps,
        checkpoint_dir=Path(args.checkpoint_dir).resolve(),
        log_file=Path(args.log).resolve(),
        consistency=args.consistency,
        precision=args.precision,
        global_batch_size=args.global_batch_size,
        micro_batch_size=args.micro_batch_size,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        checkpoint_async=not args.blocking_checkpoints,
        fail=parse_fault(args.fail),
        fail_in_save=parse_fault(args.fail_in_save),
        chaos=args.chaos,
        max_failed_worlds=args.max_failed_worlds,
        world_timeout_s=args.world_timeout,
        launch=args.launch or "elastra",
        work_dir=Path(args.work_dir) if args.work_dir else None,
    )
    try:
        return LocalLauncher(job).run()
    except PermanentError as err:
        logging.getLogger("elastra_worker").error("%s", err)
        return exitcodes.CONFIG
    except LaunchError as err:
        logging.getLogger("elastra_worker").error("%s", err)
        return exitcodes.RETRYABLE


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used by the README's usage text)."""
    p = argparse.ArgumentParser(prog="elastra-worker", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_run(
        sub.add_parser("run", help="run CMD as this pod's trainer(s): elastra-worker run -- CMD")
    )
    _add_local(sub.add_parser("local", help="run CMD as an elastic world on this machine"))
    return p


def _add_run(run: argparse.ArgumentParser) -> None:
    run.add_argument("--control-dir", help="agent<->trainer files (default: a temp dir)")
    run.add_argument("--state-file", help="write the agent's state here (JSON)")
    run.add_argument("--stop-timeout", type=float, default=120.0, help="seconds to stop a world")
    run.add_argument(
        "--launch",
        choices=LAUNCHES,
        help=f"elastra: CMD uses the Session API (stop requests at step boundaries); torchrun: "
        f"CMD is a plain torchrun script, started with torchrun's variables and stopped with "
        f"SIGTERM on every resize (default: ${LAUNCH_ENV}, else elastra)",
    )
    run.add_argument(
        "--grace",
        type=float,
        default=float(os.environ.get("ELASTRA_GRACE_SECONDS", "25")),
        help="seconds from SIGTERM to a forced kill, on eviction and, with --launch torchrun, on "
        "every resize (default: $ELASTRA_GRACE_SECONDS, else 25; keep it below the pod's "
        "terminationGracePeriodSeconds)",
    )


def _add_local(loc: argparse.ArgumentParser) -> None:
    loc.add_argument(
        "--schedule",
        required=True,
        help="SIZE:POINT[:PLAN][,...]: POINT is a step or SECONDSs since the start "
        "(e.g. 4:0,2:20,3:40s); PLAN is /-separated key=value of tp, pp, vpp, "
        "sharding (none|optimizer|full), recompute (none|selective|full), mb "
        "(e.g. 4:0,4:10:tp=2,8:30:tp=2/pp=2/sharding=full); dp = SIZE/(tp*pp)",
    )
    loc.add_argument(
        "--steps",
        type=int,
        help="total optimizer steps: the last world stops there (required, except with "
        "--launch torchrun, where the script counts its own steps)",
    )
    loc.add_argument(
        "--launch",
        choices=LAUNCHES,
        default="elastra",
        help="elastra: CMD uses the Session API; torchrun: CMD is a plain torchrun script, "
        "restarted with SIGTERM on every resize (resize at times: SIZE:SECONDSs)",
    )
    loc.add_argument("--checkpoint-dir", required=True, help="the job's checkpoint root")
    loc.add_argument("--log", required=True, help="JSON lines, one per step, from rank 0")
    loc.add_argument("--consistency", choices=("none", "data", "bitwise"), default="none")
    loc.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=DEFAULT_PRECISION,
        help="what the trainers compute in, as a TrainingJob's training.precision "
        "(default %(default)s; bf16 and fp16 autocast run on the CPU too)",
    )
    loc.add_argument("--fail", help="RANK@STEP: SIGKILL that rank's trainer during that step")
    loc.add_argument("--fail-in-save", help="RANK@STEP: SIGKILL it while saving that step")
    loc.add_argument(
        "--chaos",
        help="SEED:P_STEP:P_SAVE: every trainer dies at random mid-step (P_STEP) or in a save",
    )
    loc.add_argument(
        "--max-failed-worlds",
        type=int,
        default=MAX_FAILED_WORLDS,
        help="give up after this many failed worlds (default %(default)s)",
    )
    loc.add_argument(
        "--global-batch-size", type=int, default=32, help="samples per step, split over dp"
    )
    loc.add_argument(
        "--micro-batch-size", type=int, default=2, help="the plans' mb unless an entry sets one"
    )
    loc.add_argument("--seed", type=int, default=0)
    loc.add_argument(
        "--checkpoint-every", type=int, default=0, help="also checkpoint every N steps"
    )
    loc.add_argument(
        "--blocking-checkpoints",
        action="store_true",
        help="every save blocks training until committed (a TrainingJob's checkpoint."
        "asynchronous: false); default: periodic saves are written in the background",
    )
    loc.add_argument(
        "--world-timeout",
        type=float,
        default=600.0,
        help="seconds a world may take to form and finish before the run fails (exit 75)",
    )
    loc.add_argument("--work-dir", help="pods' assignment and control files (default: temp)")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``elastra-worker`` console script."""
    own, command = _split_command(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [{args.cmd} %(process)d] %(name)s: %(message)s",
    )
    if not command:
        print("elastra-worker: give the training command after --", file=sys.stderr)
        return exitcodes.CONFIG
    try:
        if args.cmd == "run":
            return _run(args, command)
        return _local(args, command)
    except (AssignmentError, ValueError) as err:
        print(f"elastra-worker: {err}", file=sys.stderr)
        return exitcodes.CONFIG


if __name__ == "__main__":
    sys.exit(main())
