"""A docker daemon of Elastra's own for kind: ``python -m e2e.kind.dockerd start|stop|status|env``.

Why: kind needs a container runtime, and these machines run no docker daemon (no systemd
either). This one is private to the project: its data-root lives in the per-user cache (the
node image stays loaded between runs), its exec-root, pidfile and socket in a run folder of
its own, and it is stopped by the PID it wrote. Two settings make kind work on a machine whose
root lacks CAP_SYS_RESOURCE: the default runtime is runcwrap (e2e/kind/runcwrap), which drops
that capability from ``--privileged`` containers before runc runs them. And to leave the
host's firewall and forwarding alone, the daemon starts with ``--iptables=false
--ip-forward=false --ip-masq=false --bridge=none``: nodes talk to each other on kind's bridge
and to the host through docker's userland proxy (the API server's published port); nothing is
routed off the machine. ``env`` prints the DOCKER_HOST and PATH for kind.

Users who already run docker do not need this: e2e/kind.sh uses their daemon unless
ELASTRA_KIND_DOCKERD=1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_POOL = "172.29.0.0/16"
"""Docker's address pool for kind's network (/24 each). Overridable (ELASTRA_KIND_POOL)
because it must not overlap a network the machine already routes."""


DAEMON_HOST_PATHS = (Path("/etc/docker/key.json"), Path("/run/docker"))
"""What dockerd 20.10 writes outside --data-root/--exec-root whatever its flags: its trust key
and its plugin discovery folder."""


def say(msg: str) -> None:
    print(f"kind-dockerd: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class DockerdDirs:
    """Where this user's daemon keeps its state (data) and runtime files (run)."""

    data: Path
    run: Path

    @staticmethod
    def default() -> DockerdDirs:
        base = os.environ.get("ELASTRA_CACHE") or str(Path.home() / ".cache" / "elastra")
        # Unix socket paths are limited to 107 bytes: containerd's sockets live under the
        # exec-root, so the run folder stays short (not under the cache).
        run = os.environ.get("ELASTRA_KIND_RUN") or f"/run/elastra-kind-{os.getuid()}"
        return DockerdDirs(Path(base) / "kind" / "docker", Path(run))

    @property
    def sock(self) -> Path:
        return self.run / "docker.sock"

    @property
    def pidfile(self) -> Path:
        return self.run / "docker.pid"

    @property
    def exec_root(self) -> Path:
        return self.run / "exec"

    @property
    def log(self) -> Path:
        return self.data.parent / "dockerd.log"

    @property
    def shims(self) -> Path:
        """A PATH folder whose `docker` is the client that matches this daemon."""
        return self.run / "bin"

    @property
    def host(self) -> str:
        return f"unix://{self.sock}"

    @property
    def created(self) -> Path:
        """Host paths the daemon writes outside its own folders that were not there before it
        started (its trust key, its plugin folder), so that `stop` removes exactly those."""
        return self.data.parent / "dockerd-created.json"

    @property
    def cgroup_parent(self) -> str:
        """The cgroup our containers live under (docker's default, /docker, would be left
        behind empty in every hierarchy, and could be another daemon's)."""
        return f"/{self.run.name}"


def dockerd_argv(layout: DockerdDirs, runcwrap: Path, pool: str = DEFAULT_POOL) -> list[str]:
    return [
        "dockerd",
        f"--host={layout.host}",
        f"--pidfile={layout.pidfile}",
        f"--data-root={layout.data}",
        f"--exec-root={layout.exec_root}",
        "--iptables=false",
        "--ip6tables=false",
        "--ip-forward=false",
        "--ip-masq=false",
        "--bridge=none",
        "--userland-proxy=true",
        f"--default-address-pool=base={pool},size=24",
        f"--add-runtime=elastra-runc={runcwrap}",
        "--default-runtime=elastra-runc",
        "--storage-driver=overlay2",
        f"--cgroup-parent={layout.cgroup_parent}",
        "--log-level=warn",
    ]


def read_pid(layout: DockerdDirs) -> int | None:
    """The daemon's PID when it runs (pidfile present and that process is a dockerd)."""
    try:
        pid = int(layout.pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if not cmdline or Path(cmdline[0].decode()).name != "dockerd":
        return None
    if f"--pidfile={layout.pidfile}".encode() not in cmdline:
        return None
    return pid


def ensure_installed() -> None:
    """Install Debian's docker.io when dockerd is missing, without starting its service.

    The package's maintainer script would start a system-wide dockerd (with its default
    bridge and firewall rules); a policy-rc.d that forbids service starts is in place while
    apt runs, and only when none was there before.
    """
    if Path("/usr/sbin/dockerd").exists() and Path("/usr/bin/docker").exists():
        return
    policy = Path("/usr/sbin/policy-rc.d")
    ours = not policy.exists()
    if ours:
        policy.write_text("#!/bin/sh\n# elastra e2e/kind/dockerd.py: no service starts\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "docker.io"]
        say("installing docker.io (apt-get; its service is not started)")
        if subprocess.run(argv, env=env, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, check=False)
            subprocess.run(argv, env=env, check=True)
    finally:
        if ours:
            policy.unlink(missing_ok=True)


def start(layout: DockerdDirs, runcwrap: Path, *, pool: str, timeout: float = 60.0) -> int:
    """Start the daemon unless it runs; returns its PID once it answers on its socket."""
    pid = read_pid(layout)
    if pid is not None:
        say(f"already running (pid {pid}, {layout.host})")
        return pid
    ensure_installed()
    layout.data.mkdir(parents=True, exist_ok=True)
    layout.run.mkdir(parents=True, exist_ok=True)
    layout.shims.mkdir(exist_ok=True)
    shim = layout.shims / "docker"
    shim.unlink(missing_ok=True)
    shim.symlink_to("/usr/bin/docker")
    argv = dockerd_argv(layout, runcwrap, pool)
    argv[0] = "/usr/sbin/dockerd"
    fresh = [str(p) for p in DAEMON_HOST_PATHS if not p.exists()]
    layout.created.write_text(json.dumps(fresh) + "\n")
    say("starting: " + " ".join(argv))
    with layout.log.open("ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"kind-dockerd: dockerd exited ({proc.returncode}); see {layout.log}")
        ok = subprocess.run(
            ["/usr/bin/docker", "-H", layout.host, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if ok.returncode == 0:
            say(f"docker {ok.stdout.strip()} up (pid {proc.pid}, {layout.host})")
            return proc.pid
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit(
        f"kind-dockerd: no answer on {layout.sock} after {timeout:.0f}s; see {layout.log}"
    )


def stop(layout: DockerdDirs, timeout: float = 60.0) -> bool:
    """Stop the daemon by its PID (SIGTERM, then SIGKILL); False when none was running."""
    pid = read_pid(layout)
    if pid is None:
        return False
    say(f"stopping dockerd (pid {pid})")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)
    if Path(f"/proc/{pid}").exists():
        say(f"dockerd {pid} ignored SIGTERM for {timeout:.0f}s: SIGKILL")
        os.kill(pid, signal.SIGKILL)
    # The run folder (exec-root, socket, pidfile, the docker shim) is for a running daemon
    # only; its exec-root holds mounts (netns files) only while the daemon runs.
    shutil.rmtree(layout.run, ignore_errors=True)
    remove_cgroups(layout)
    remove_created(layout)
    return True


def remove_created(layout: DockerdDirs) -> None:
    """Remove the DAEMON_HOST_PATHS that our daemon's start created."""
    try:
        created = json.loads(layout.created.read_text())
    except (OSError, ValueError):
        return
    for raw in created:
        path = Path(raw)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    layout.created.unlink(missing_ok=True)


def remove_cgroups(layout: DockerdDirs) -> list[Path]:
    """rmdir the daemon's (empty) cgroup parent in every v1 hierarchy or in v2; what is left."""
    left = []
    root = Path("/sys/fs/cgroup")
    name = layout.cgroup_parent.lstrip("/")
    for top in [*root.glob(f"*/{name}"), root / name]:
        if not top.is_dir():
            continue
        for sub in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
            if sub.is_dir():
                try:
                    sub.rmdir()
                except OSError:
                    left.append(sub)
        try:
            top.rmdir()
        except OSError:
            left.append(top)
    return left


def env(layout: DockerdDirs) -> dict[str, str]:
    return {
        "DOCKER_HOST": layout.host,
        "PATH": f"{layout.shims}:{os.environ.get('PATH', '')}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.kind.dockerd")
    parser.add_argument("command", choices=["start", "stop", "status", "env"])
    parser.add_argument("--runcwrap", type=Path, help="the runc wrapper (start)")
    args = parser.parse_args(argv)
    layout = DockerdDirs.default()
    if args.command == "start":
        if args.runcwrap is None:
            parser.error("start needs --runcwrap (e2e/kind/build.sh --print-bindir)/runcwrap")
        start(layout, args.runcwrap, pool=os.environ.get("ELASTRA_KIND_POOL", DEFAULT_POOL))
    elif args.command == "stop":
        if not stop(layout):
            say("not running")
    elif args.command == "status":
        pid = read_pid(layout)
        print(json.dumps({"pid": pid, "host": layout.host, "data": str(layout.data)}))
        return 0 if pid else 1
    else:
        for key, value in env(layout).items():
            print(f"export {key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
