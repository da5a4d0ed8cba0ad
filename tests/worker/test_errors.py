"""errors: an uncaught PermanentError ends a process with the permanent code and one line;
every other exception keeps Python's own ending."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elastra_worker import exitcodes
from elastra_worker.termination import TERMINATION_LOG_ENV

SCRIPT = textwrap.dedent(
    """
    import sys
    from elastra_worker.errors import PermanentError, install_hook
    install_hook()
    install_hook()  # twice: still one hook
    print("started", flush=True)
    if sys.argv[1] == "permanent":
        raise PermanentError("plan dp=2 (sharding full): the model is\\nnot laid out for it")
    raise RuntimeError("a crash")
    """
)


@pytest.mark.parametrize(
    ("kind", "code", "line", "traceback"),
    [
        ("permanent", exitcodes.CONFIG, "plan dp=2 (sharding full): the model is not laid out "
         "for it", False),
        ("crash", 1, "", True),
    ],
)  # fmt: skip
def test_how_an_uncaught_error_ends_the_process(
    tmp_path: Path, kind: str, code: int, line: str, traceback: bool
) -> None:
    message = tmp_path / "termination-log"
    message.touch()  # the kubelet creates it; the worker only writes it
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, kind],
        env={TERMINATION_LOG_ENV: str(message), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == code, out.stderr
    assert out.stdout == "started\n"
    assert ("Traceback" in out.stderr) == traceback
    assert message.read_text() == (line + "\n" if line else "")
    if line:
        assert out.stderr == line + "\n"
