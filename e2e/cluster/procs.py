"""Start and stop the cluster's daemons by PID, never by name.

Why: these machines have no systemd, other people's processes run beside ours, and a test run
must leave nothing behind. Each daemon is started in its own session with its output in a log
file, and its PID plus the exact executable path are recorded; stopping checks that the PID
still runs that executable (PIDs are reused) before signalling it, then waits for it to go.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Daemon:
    """One started process, as recorded in the cluster state file."""

    name: str
    pid: int
    exe: str
    log: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "exe": self.exe, "log": self.log}

    @staticmethod
    def from_json(raw: dict[str, object]) -> Daemon:
        pid = raw["pid"]
        if not isinstance(pid, int):
            raise TypeError(f"bad pid in state file: {pid!r}")
        return Daemon(name=str(raw["name"]), pid=pid, exe=str(raw["exe"]), log=str(raw["log"]))


def start(name: str, argv: list[str], *, log: Path, env: dict[str, str] | None = None) -> Daemon:
    """Start argv[0] detached (own session, stdin closed), appending its output to log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n==> {time.strftime('%FT%T')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    return Daemon(name=name, pid=proc.pid, exe=os.path.realpath(argv[0]), log=str(log))


def _reap(pid: int) -> None:
    """Collect the exit status when the daemon is our own child (the pytest fixture case)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def is_running(daemon: Daemon) -> bool:
    """True when daemon.pid is alive (not a zombie) and still runs daemon.exe."""
    _reap(daemon.pid)
    try:
        exe = os.readlink(f"/proc/{daemon.pid}/exe")
        stat = Path(f"/proc/{daemon.pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state != "Z" and exe.removesuffix(" (deleted)") == daemon.exe


def stop(daemon: Daemon, *, timeout: float = 15.0) -> bool:
    """SIGTERM the daemon, SIGKILL it after timeout; returns False if it was not running."""
    if not is_running(daemon):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(daemon.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_running(daemon):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(daemon.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and is_running(daemon):
        time.sleep(0.05)
    if is_running(daemon):
        raise RuntimeError(f"{daemon.name} (pid {daemon.pid}) survived SIGKILL")
    return True


def rss_kib(daemon: Daemon) -> int:
    """Resident memory of the daemon in KiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{daemon.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return 0


@contextlib.contextmanager
def frozen(daemon: Daemon) -> Iterator[None]:
    """The daemon stopped (SIGSTOP) for the block, continued (SIGCONT) however the block ends.

    A frozen API server is the hard kind of outage: clients' connections stay open and nothing
    answers (as behind a load balancer whose backend hangs), so only their own timeouts help.
    """
    if not is_running(daemon):
        raise RuntimeError(f"{daemon.name} (pid {daemon.pid}) is not running")
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon.pid, signal.SIGCONT)
