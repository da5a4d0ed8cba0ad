"""errors: an uncaught PermanentError ends a process with the permanent code and one line (the
termination message too), a RetryableError with the retryable code and one line; every other
exception keeps Python's own ending."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from elastra_worker import exitcodes
from elastra_worker.launcher import free_port
from elastra_worker.termination import TERMINATION_LOG_ENV

SCRIPT = textwrap.dedent(
    """
    import sys
    from elastra_worker.errors import PermanentError, RetryableError, install_hook
    install_hook()
    install_hook()  # twice: still one hook
    print("started", flush=True)
    if sys.argv[1] == "permanent":
        raise PermanentError("plan dp=2 (sharding full): the model is\\nnot laid out for it")
    if sys.argv[1] == "retryable":
        raise RetryableError("checkpoint.uri s3://b/j: cannot reach the object store")
    raise RuntimeError("a crash")
    """
)


@dataclass(frozen=True)
class Ending:
    kind: str
    code: int
    line: str
    """The one line on stderr; empty: Python's own traceback."""
    message: bool
    """The line is the container's termination message too."""


ENDINGS = [
    Ending("permanent", exitcodes.CONFIG,
           "plan dp=2 (sharding full): the model is not laid out for it", message=True),
    Ending("retryable", exitcodes.RETRYABLE,
           "checkpoint.uri s3://b/j: cannot reach the object store", message=False),
    Ending("crash", 1, "", message=False),
]  # fmt: skip


@pytest.mark.parametrize("end", ENDINGS, ids=lambda end: end.kind)
def test_how_an_uncaught_error_ends_the_process(tmp_path: Path, end: Ending) -> None:
    termination_log = tmp_path / "termination-log"
    termination_log.touch()  # the kubelet creates it; the worker only writes it
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, end.kind],
        env={TERMINATION_LOG_ENV: str(termination_log), "PATH": "/usr/bin:/bin",
             "PYTHONPATH": ":".join(sys.path)},  # the tree under test
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == end.code, out.stderr
    assert out.stdout == "started\n"
    assert ("Traceback" in out.stderr) == (not end.line)
    assert termination_log.read_text() == (end.line + "\n" if end.message else "")
    if end.line:
        assert out.stderr == end.line + "\n"


PEER = textwrap.dedent(
    """
    import datetime, os, pathlib, sys
    import torch, torch.distributed as dist
    from elastra_worker.errors import install_hook
    install_hook()
    rank, port, gone = int(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=30))
    if sys.argv[4] == "ddp":  # its constructor is a collective too: both ranks build it
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    if rank == 1:  # a peer whose pod is killed: no goodbye
        gone.write_text("")
        os._exit(9)
    while not gone.exists():
        pass
    if sys.argv[4] == "collective":
        dist.all_reduce(torch.ones(4))
    else:  # DDP's reducer all-reduces from autograd's hooks: no torch.distributed frame
        model(torch.ones(2, 4)).sum().backward()
    print("the collective did not fail", flush=True)
    """
)


@pytest.mark.parametrize(("where", "frame"), [("collective", "all_reduce"), ("ddp", "backward")])
def test_a_collective_whose_peer_is_gone_ends_the_trainer_as_peers_lost(
    tmp_path: Path, where: str, frame: str
) -> None:
    """Rank 1 dies after the group formed; rank 0's next collective fails (a call of
    torch.distributed, or DDP's gradient all-reduce inside backward): the traceback stays
    and the code tells the agent a peer is gone."""
    port, gone = free_port(), tmp_path / "gone"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    ranks = [
        subprocess.Popen([sys.executable, "-c", PEER, str(rank), str(port), str(gone), where],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in (0, 1)
    ]  # fmt: skip
    (out, err), _ = (r.communicate(timeout=120) for r in ranks)
    assert ranks[1].returncode == 9
    assert ranks[0].returncode == exitcodes.PEERS_LOST, err
    assert "Traceback" in err and frame in err, err
    assert out == ""
