"""Fault injection: a ``--fail`` kill fires once per run, whoever inherits its variables."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from elastra_worker.faults import (
    FIRED_DIR_ENV,
    IN_SAVE,
    KILL_AT_STEP_ENV,
    KILL_IN_SAVE_ENV,
    MID_STEP,
    Faults,
)

KILLS = {
    MID_STEP: (KILL_AT_STEP_ENV, "at_step", "kill_at_step"),
    IN_SAVE: (KILL_IN_SAVE_ENV, "in_save", "kill_in_save"),
}
"""Where a kill fires: its variable, the call that fires it, the field that arms it."""


@pytest.mark.parametrize("where", sorted(KILLS))
def test_a_kill_marks_itself_fired_and_disarms_the_next_trainer(tmp_path: Path, where: str) -> None:
    env_name, call, _ = KILLS[where]
    env = {env_name: "4", FIRED_DIR_ENV: str(tmp_path), "RANK": "1"}
    script = (
        "import sys; from elastra_worker.faults import Faults\n"
        f"faults = Faults.from_env({env!r})\n"
        f"faults.{call}(3)\n"
        "print('survived step 3', flush=True)\n"
        f"faults.{call}(4)\n"
        "print('survived step 4', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout == "survived step 3\n"
    assert f"rank 1 of world v? killed {where} 4" in proc.stderr
    assert (tmp_path / where).read_text() == "4\n"
    # the next trainer with the same variables (its agent lived on) is not armed with it
    again = Faults.from_env(env)
    assert (again.kill_at_step, again.kill_in_save) == (None, None)
    other_env, _, other_field = next(kill for name, kill in KILLS.items() if name != where)
    assert getattr(Faults.from_env({**env, other_env: "9"}), other_field) == 9, "the other kill"


def test_without_a_fired_folder_a_kill_stays_armed() -> None:
    faults = Faults.from_env({KILL_IN_SAVE_ENV: "9"})
    assert faults.kill_in_save == 9
