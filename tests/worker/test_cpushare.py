"""Threads per trainer from the pod's CPU request (elastra_worker.cpushare)."""

from __future__ import annotations

import pytest

from elastra_worker.cpushare import requested_threads, trainer_threads, with_threads


@pytest.mark.parametrize(
    ("env", "trainers", "threads"),
    [
        ({"ELASTRA_CPU_MILLIS": "250"}, 1, 1),  # a fraction of a core: one thread, not zero
        ({"ELASTRA_CPU_MILLIS": "2000"}, 1, 2),
        ({"ELASTRA_CPU_MILLIS": "2500"}, 1, 2),  # whole cores only: no oversubscription
        ({"ELASTRA_CPU_MILLIS": "96000"}, 8, 12),  # a GPU pod's trainers share its request
        ({"ELASTRA_CPU_MILLIS": "4000"}, 8, 1),
        ({"ELASTRA_CPU_MILLIS": "0"}, 1, None),  # no request: PyTorch's default
        ({}, 1, None),
        ({"ELASTRA_CPU_MILLIS": "lots"}, 1, None),
        ({"ELASTRA_CPU_MILLIS": "4000", "OMP_NUM_THREADS": "3"}, 1, None),  # the job's own wins
    ],
)
def test_trainer_threads(env: dict[str, str], trainers: int, threads: int | None) -> None:
    assert trainer_threads(env, trainers=trainers) == threads


def test_with_threads_sets_the_variable_only_when_it_applies() -> None:
    assert with_threads({"ELASTRA_CPU_MILLIS": "250"}, trainers=1)["OMP_NUM_THREADS"] == "1"
    assert with_threads({"OMP_NUM_THREADS": "3"}, trainers=1) == {"OMP_NUM_THREADS": "3"}
    assert "OMP_NUM_THREADS" not in with_threads({}, trainers=1)


@pytest.mark.parametrize(
    ("value", "threads"), [("4", 4), ("0", None), ("-1", None), ("", None), ("x", None)]
)
def test_requested_threads(value: str, threads: int | None) -> None:
    assert requested_threads({"OMP_NUM_THREADS": value}) == threads
