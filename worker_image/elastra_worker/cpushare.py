"""How many CPU threads each trainer of a pod may use: its share of the pod's CPU request.

PyTorch sizes its intra-op thread pool by the cores it can see, which in a container is the
whole node. Several trainers (the ranks of a CPU pod, the pods of a job on one node, other
tenants) then run many more busy threads than they were given cores, and OpenMP threads spin
while they wait: on a 2-core node, three cpu-tiny workers trained 14 times slower than two
(0.5 against 7 steps per second) until each used one thread. torchrun sets
``OMP_NUM_THREADS=1`` for the same reason when it starts several processes.

The operator passes the worker container's CPU request in millicores (the downward API, in
``ELASTRA_CPU_MILLIS``); each trainer gets ``request / trainers`` whole cores, at least one. A
job that sets ``OMP_NUM_THREADS`` itself keeps its value; a pod without a CPU request (the
variable is 0 or absent) keeps PyTorch's default.
"""

from __future__ import annotations

from collections.abc import Mapping

CPU_MILLIS_ENV = "ELASTRA_CPU_MILLIS"
THREADS_ENV = "OMP_NUM_THREADS"


def trainer_threads(env: Mapping[str, str], *, trainers: int) -> int | None:
    """Threads per trainer from the pod's CPU request, or None to leave PyTorch's default."""
    if env.get(THREADS_ENV):
        return None
    try:
        millis = int(env.get(CPU_MILLIS_ENV, "0"))
    except ValueError:
        return None
    if millis <= 0:
        return None
    return max(1, millis // 1000 // max(trainers, 1))


def with_threads(env: Mapping[str, str], *, trainers: int) -> dict[str, str]:
    """``env`` plus ``OMP_NUM_THREADS`` for one of ``trainers`` trainers, when it applies."""
    threads = trainer_threads(env, trainers=trainers)
    out = dict(env)
    if threads is not None:
        out[THREADS_ENV] = str(threads)
    return out


def requested_threads(env: Mapping[str, str]) -> int | None:
    """``OMP_NUM_THREADS`` as a positive count (a standby applies it after importing torch)."""
    try:
        threads = int(env.get(THREADS_ENV, ""))
    except ValueError:
        return None
    return threads if threads > 0 else None
