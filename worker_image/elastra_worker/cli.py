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
from .agent import Agent, AgentConfig
from .assignment import AssignmentError, assignment_from_env, assignment_path
from .launcher import LaunchError, LocalJob, LocalLauncher, parse_fault, parse_schedule
from .lifeline import arm_from_env
from .metrics import DEFAULT_METRICS_PORT, METRICS_PORT_ENV, WorkerCollector, serve


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
        )
    )
    port = int(os.environ.get(METRICS_PORT_ENV) or DEFAULT_METRICS_PORT)
    if port:
        serve(port, WorkerCollector(lambda: agent.control.progress(0), lambda: agent.state))
    return agent.run()


def _local(args: argparse.Namespace, command: list[str]) -> int:
    job = LocalJob(
        command=command,
        schedule=parse_schedule(args.schedule, args.steps),
        steps=args.steps,
        checkpoint_dir=Path(args.checkpoint_dir).resolve(),
        log_file=Path(args.log).resolve(),
        consistency=args.consistency,
        global_batch_size=args.global_batch_size,
        micro_batch_size=args.micro_batch_size,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        fail=parse_fault(args.fail),
        fail_in_save=parse_fault(args.fail_in_save),
        world_timeout_s=args.world_timeout,
        work_dir=Path(args.work_dir) if args.work_dir else None,
    )
    try:
        return LocalLauncher(job).run()
    except LaunchError as err:
        logging.getLogger("elastra_worker").error("%s", err)
        return exitcodes.RETRYABLE


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used by the README's usage text)."""
    p = argparse.ArgumentParser(prog="elastra-worker", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run CMD as this pod's trainer(s): elastra-worker run -- CMD")
    run.add_argument("--control-dir", help="agent<->trainer files (default: a temp dir)")
    run.add_argument("--state-file", help="write the agent's state here (JSON)")
    run.add_argument("--stop-timeout", type=float, default=120.0, help="seconds to stop a world")
    run.add_argument(
        "--grace",
        type=float,
        default=float(os.environ.get("ELASTRA_GRACE_SECONDS", "25")),
        help="seconds from SIGTERM to a forced stop (keep below the pod's grace period)",
    )
    loc = sub.add_parser("local", help="run CMD as an elastic world on this machine")
    loc.add_argument("--schedule", required=True, help="SIZE:STEP[,SIZE:STEP...], e.g. 4:0,2:20")
    loc.add_argument("--steps", type=int, required=True, help="total optimizer steps")
    loc.add_argument("--checkpoint-dir", required=True)
    loc.add_argument("--log", required=True, help="JSON lines, one per step, from rank 0")
    loc.add_argument("--consistency", choices=("none", "data", "bitwise"), default="none")
    loc.add_argument("--fail", help="RANK@STEP: SIGKILL that rank's trainer during that step")
    loc.add_argument("--fail-in-save", help="RANK@STEP: SIGKILL it while saving that step")
    loc.add_argument("--global-batch-size", type=int, default=32)
    loc.add_argument("--micro-batch-size", type=int, default=2)
    loc.add_argument("--seed", type=int, default=0)
    loc.add_argument(
        "--checkpoint-every", type=int, default=0, help="also checkpoint every N steps"
    )
    loc.add_argument("--world-timeout", type=float, default=600.0, help="seconds per world")
    loc.add_argument("--work-dir", help="pods' assignment and control files (default: temp)")
    return p


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
