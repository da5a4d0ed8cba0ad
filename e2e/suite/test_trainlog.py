"""The judges of the e2e suite, judged: each check passes a correct record and fails a bad one.

Why: a check that cannot fail proves nothing. These run without a cluster, in seconds.
"""

from __future__ import annotations

import json

import pytest
from e2e.trainlog import (
    StepRecord,
    TrainLogError,
    check_contiguous,
    check_data_order,
    check_resumes,
    parse_step_log,
    resumes,
    world_spans,
)

from elastra_worker.dataorder import DataOrder

ORDER = DataOrder(7, 4096, 24)


def record(step: int, version: int, size: int, samples: list[int] | None = None) -> StepRecord:
    chosen = sorted(ORDER.step_samples(step)) if samples is None else samples
    return StepRecord(step, version, size, tuple(chosen))


def line(step: int, version: int, size: int) -> str:
    r = record(step, version, size)
    return json.dumps(
        {"step": step, "worldVersion": version, "worldSize": size, "samples": list(r.samples)}
    )


GOOD = [record(0, 1, 3), record(1, 1, 3), record(2, 2, 2), record(3, 3, 3)]


def test_step_log_parses_and_a_torn_line_is_an_error() -> None:
    text = "\n".join(line(s, 1, 3) for s in range(3)) + "\n"
    assert [r.step for r in parse_step_log(text)] == [0, 1, 2]
    timed = json.dumps({**json.loads(line(0, 1, 3)), "endedAt": 1764900000.25})
    assert parse_step_log(timed)[0].ended_at == 1764900000.25
    assert parse_step_log(line(0, 1, 3))[0].ended_at is None  # a log from before endedAt
    with pytest.raises(TrainLogError, match="line 2"):
        parse_step_log(line(0, 1, 3) + '\n{"step": 1, "worldVer')


def test_contiguous_steps_pass_and_a_gap_fails() -> None:
    check_contiguous(GOOD)
    with pytest.raises(TrainLogError, match=r"missing \[2\]"):
        check_contiguous([GOOD[0], GOOD[1], GOOD[3]])


def test_world_spans_follow_versions_and_a_version_going_back_fails() -> None:
    spans = world_spans(GOOD)
    assert [(s.version, s.size, s.first_step, s.last_step) for s in spans] == [
        (1, 3, 0, 1),
        (2, 2, 2, 2),
        (3, 3, 3, 3),
    ]
    with pytest.raises(TrainLogError, match="went back"):
        world_spans([record(0, 2, 3), record(1, 1, 3)])


def test_data_order_matches_a_static_run_and_other_samples_fail() -> None:
    assert check_data_order(GOOD, seed=7, dataset_size=4096, global_batch_size=24) == 4
    with pytest.raises(TrainLogError, match="step 1"):
        check_data_order(
            [GOOD[0], record(1, 1, 3, samples=list(range(24)))],
            seed=7,
            dataset_size=4096,
            global_batch_size=24,
        )
    with pytest.raises(TrainLogError):  # another seed is another order
        check_data_order(GOOD, seed=8, dataset_size=4096, global_batch_size=24)


LOG_W0 = """\
2026-11-30 02:46:50,902 api rank 0 committed step 1 (0.6 MB in 0.18s)
2026-11-30 02:47:39,403 api rank 0 committed step 7 (0.6 MB in 0.49s)
2026-11-30 02:48:32,729 api rank 0 restored step 7 (saved by 3 ranks) into a world of 2
"""
LOG_W1 = """\
2026-11-30 02:48:32,729 api rank 1 restored step 7 (saved by 3 ranks) into a world of 2
2026-11-30 02:49:13,069 api rank 0 committed step 18 (0.6 MB in 0.19s)
2026-11-30 02:49:40,001 api rank 0 restored step 18 (saved by 2 ranks) into a world of 3
"""


def test_resumes_pair_each_restore_with_the_newest_commit_across_pods() -> None:
    found = resumes(LOG_W1.splitlines() + LOG_W0.splitlines())
    assert [(r.step, r.world_size, r.last_committed) for r in found] == [(7, 2, 7), (18, 3, 18)]
    check_resumes(found)


LOG_MEMORY = """\
2026-12-05 07:24:50,100 checkpoint rank 0 committed step 60 in the background (0.6 MB in 0.18s)
2026-12-05 07:25:01,400 carry rank 0 resumed step 68 from memory into a world of 2 (world v2, \
plan dp2tp1pp1; rank 0 of world v1 before)
2026-12-05 07:25:01,700 checkpoint rank 0 committed step 68 in the background (0.6 MB in 0.18s)
2026-12-05 07:25:40,300 carry rank 0 resumed step 1070 from peers (rank 1 sent 0.3 MB in \
0.01s) into a world of 3 (plan dp3tp1pp1)
"""


def test_a_world_that_kept_its_state_in_memory_or_took_it_from_peers_is_a_resume() -> None:
    # the stop saved nothing: each new world commits the step it resumed from after it
    found = resumes(LOG_MEMORY.splitlines())
    assert [(r.step, r.world_size, r.last_committed) for r in found] == [
        (68, 2, 60),
        (1070, 3, 68),
    ]
    check_resumes(found)


def test_a_restore_of_an_older_checkpoint_is_a_lost_step() -> None:
    stale = LOG_W0.replace("restored step 7", "restored step 1")
    with pytest.raises(TrainLogError, match=r"restored step 1 .* step 7 was the newest"):
        check_resumes(resumes(stale.splitlines()))
