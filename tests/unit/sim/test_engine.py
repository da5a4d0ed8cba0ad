"""The engine and the policies, on a tiny cluster where the outcome can be worked out."""

from __future__ import annotations

from elastra.sim.engine import FaultRates, Simulation
from elastra.sim.experiment import run_policies
from elastra.sim.fleet import SimCluster
from elastra.sim.policies import POLICY_NAMES, make_policy
from elastra.sim.speed import SpeedModel
from elastra.sim.trace import parse_trace

HEADER = "name,submitTime,gpus,gpuType,durationSeconds,minGpus,maxGpus,model"


def test_a_lone_static_job_takes_exactly_its_duration(tiny: SimCluster, speed: SpeedModel) -> None:
    jobs = parse_trace(f"{HEADER}\nx,100,8,H100,3600,8,8,gpt-350m\n", source="t.csv")
    (result,) = run_policies(tiny, jobs, ["static"], speed=speed)
    assert abs(result.avg_jct_s - 3600) < 1e-6
    assert abs(result.makespan_s - 3700) < 1e-6
    # 8 of the cluster's 24 GPUs for 3600 of 3700 seconds.
    assert abs(result.gpu_utilization - 8 * 3600 / (24 * 3700)) < 1e-9
    assert result.restarts == 0


def test_gang_waits_for_the_whole_gang(tiny: SimCluster, speed: SpeedModel) -> None:
    text = f"{HEADER}\na,0,16,H100,1000,16,16,gpt-350m\nb,10,16,H100,1000,16,16,gpt-350m\n"
    (result,) = run_policies(tiny, parse_trace(text, source="t.csv"), ["static"], speed=speed)
    assert result.jcts == (1000.0, 1990.0)


def test_elastic_starts_small_and_grows_through_decide(tiny: SimCluster, speed: SpeedModel) -> None:
    # b (min 4) arrives while a holds all 16 H100s: elastic shrinks a to admit b.
    text = f"{HEADER}\na,0,16,H100,7200,8,16,gpt-350m\nb,10,8,H100,600,4,8,gpt-350m\n"
    jobs = parse_trace(text, source="t.csv")
    static, elastic = run_policies(tiny, jobs, ["static", "elastic"], speed=speed)
    assert elastic.jcts[1] < static.jcts[1] / 3  # b no longer waits two hours
    assert elastic.restarts >= 2  # a shrank, then grew back once b finished


def test_elastra_moves_work_to_a_faster_type(tiny: SimCluster, speed: SpeedModel) -> None:
    # A T4 job: the H100s are free and much faster, so elastra (and gavel-like) use them.
    jobs = parse_trace(f"{HEADER}\nt,0,4,T4,3600,4,4,gpt-125m\n", source="t.csv")
    static, gavel, elastra = run_policies(
        tiny, jobs, ["static", "gavel-like", "elastra"], speed=speed
    )
    assert static.avg_jct_s == 3600.0
    assert gavel.avg_jct_s < 3600.0 / 2
    assert elastra.avg_jct_s <= gavel.avg_jct_s


def test_faults_are_seeded_and_cost_time(tiny: SimCluster, speed: SpeedModel) -> None:
    text = "\n".join([HEADER, *(f"j{i},{i * 60},8,H100,7200,4,8,gpt-350m" for i in range(6))])
    jobs = parse_trace(text, source="t.csv")
    calm = run_policies(tiny, jobs, POLICY_NAMES, speed=speed)
    faults = FaultRates(failures_per_gpu_hour=0.01, preemptions_per_gpu_hour=0.01, seed=3)
    stormy = run_policies(tiny, jobs, POLICY_NAMES, speed=speed, faults=faults)
    again = run_policies(tiny, jobs, POLICY_NAMES, speed=speed, faults=faults)
    assert [r.to_json() for r in stormy] == [r.to_json() for r in again]
    for before, after in zip(calm, stormy, strict=True):
        assert after.makespan_s > before.makespan_s
        assert after.restarts > before.restarts
        assert after.jobs == 6


def test_every_policy_finishes_every_job_without_overcommitting(
    tiny: SimCluster, speed: SpeedModel
) -> None:
    rows = [HEADER]
    for i in range(40):
        gpus = (1, 2, 4, 8, 16)[i % 5]
        kind = "T4" if gpus <= 4 and i % 3 == 0 else "H100"
        rows.append(
            f"j{i},{i * 90},{gpus},{kind},{600 + 97 * i},{max(1, gpus // 4)},"
            f"{min(2 * gpus, 16 if kind == 'H100' else 8)},"
        )
    jobs = parse_trace("\n".join(rows), source="t.csv")
    for name in POLICY_NAMES:
        sim = Simulation(
            tiny,
            jobs,
            speed=speed,
            policy=make_policy(name),
            faults=FaultRates(failures_per_gpu_hour=0.002, seed=1),
        )
        result = sim.run()
        assert all(job.finished is not None for job in sim.jobs), name
        assert all(0 < gpus <= 24 for _, gpus in result.timeline[1:] if gpus), name
        assert all(f >= 0 for f in sim.nodes.free), name
        assert sim.allocated == 0, name
        assert 0 < result.gpu_utilization <= 1, name
        assert result.p50_jct_s <= result.p99_jct_s


def test_running_jobs_shrink_only_for_a_job_of_no_lower_priority(
    tiny: SimCluster, speed: SpeedModel
) -> None:
    """The elastic policies share by the operator's rule (``elastra.elastic.share``): a job
    holding every H100 gives some to a queued job of higher or equal priority, never lower."""
    waited = {}
    for a, b in [(0, 100), (5, 5), (100, 0)]:
        text = (
            f"{HEADER},priority\na,0,16,H100,7200,8,16,gpt-350m,{a}\n"
            f"b,10,8,H100,600,4,8,gpt-350m,{b}\n"
        )
        jobs = parse_trace(text, source="t.csv")
        for result in run_policies(tiny, jobs, ["elastic", "elastra"], speed=speed):
            waited[(result.policy, a, b)] = result.jcts[1]
    for policy in ("elastic", "elastra"):
        assert waited[(policy, 0, 100)] < 1200, "the low one shrank at once"
        assert waited[(policy, 5, 5)] < 1200, "equal priorities share"
        assert waited[(policy, 100, 0)] > 7000, "the high one kept its GPUs until it ended"
