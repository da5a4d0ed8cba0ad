"""A trainer that makes no step writes its threads' stacks (elastra_worker.stalls).

The watch runs in a child process: faulthandler's timer is one per process, and pytest's own
faulthandler plugin must keep the test runner's.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from elastra_worker.stalls import DEFAULT_STALL_DUMP_S, STALL_DUMP_ENV, StallWatch

CHILD = """
import time
from elastra_worker.stalls import StallWatch

def wait_in_a_collective(seconds):
    time.sleep(seconds)

watch = StallWatch({interval})
watch.arm()
deadline = time.monotonic() + {busy}
while time.monotonic() < deadline:  # steps: each one re-arms the watch
    time.sleep(0.05)
    watch.arm()
wait_in_a_collective({stuck})
watch.disarm()
"""


def run_child(*, interval: float, busy: float, stuck: float) -> str:
    """The child's stderr: it steps for ``busy`` seconds, then waits ``stuck`` seconds."""
    code = textwrap.dedent(CHILD.format(interval=interval, busy=busy, stuck=stuck))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return proc.stderr


def test_a_rank_that_stops_stepping_writes_where_it_waits() -> None:
    err = run_child(interval=0.5, busy=0.0, stuck=3.0)
    assert "Timeout (0:00:00.500000)!" in err, err
    assert "wait_in_a_collective" in err, err
    assert err.count("Timeout") >= 2, f"repeats while the rank stays stuck: {err}"


def test_a_rank_that_keeps_stepping_writes_nothing() -> None:
    # Steps every 50 ms for 3 s against a 2 s interval, then a short wait and a clean exit.
    assert run_child(interval=2.0, busy=3.0, stuck=0.1) == ""


def test_zero_turns_the_watch_off() -> None:
    assert run_child(interval=0, busy=0.0, stuck=1.0) == ""


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("", DEFAULT_STALL_DUMP_S), ("  ", DEFAULT_STALL_DUMP_S), ("0", 0.0), ("12.5", 12.5)],
)
def test_the_interval_comes_from_the_environment(value: str, seconds: float) -> None:
    assert StallWatch.from_env({STALL_DUMP_ENV: value}).seconds == seconds


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_interval_names_the_variable_and_what_is_right(value: str) -> None:
    with pytest.raises(ValueError, match=rf"{STALL_DUMP_ENV}.*expected seconds >= 0"):
        StallWatch.from_env({STALL_DUMP_ENV: value})
