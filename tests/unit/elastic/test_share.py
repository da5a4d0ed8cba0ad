"""Sharing a scarce type: minimums first, no livelock, no double giving."""

from __future__ import annotations

from elastra.elastic.share import Claim, shared_desired


def same(pattern: str, type_name: str) -> bool:
    return pattern == type_name


def claim(key: str, *, minimum: int, held: int, starved: bool = False) -> Claim:
    return Claim(
        key=key,
        minimum=minimum,
        held=held,
        starved=starved,
        gpu_types=frozenset({"H200"}),
    )


def test_nobody_starved_keeps_the_spec() -> None:
    me = claim("a", minimum=1, held=3)
    assert shared_desired(me, [claim("b", minimum=1, held=1)], desired=3, free=0,
                          compatible=same) == 3  # fmt: skip


def test_donor_gives_what_the_starved_job_lacks() -> None:
    me = claim("a", minimum=1, held=3)
    starved = claim("b", minimum=1, held=0, starved=True)
    assert shared_desired(me, [starved], desired=3, free=0, compatible=same) == 2


def test_free_capacity_goes_to_the_starved_job_first() -> None:
    me = claim("a", minimum=1, held=2)
    starved = claim("b", minimum=1, held=0, starved=True)
    assert shared_desired(me, [starved], desired=3, free=1, compatible=same) == 2, (
        "does not grow into the free pod, does not give either"
    )


def test_a_pod_already_retiring_is_not_given_twice() -> None:
    # held counts the retiring pod: 2 in the world + 1 going away = 3, give 1 -> stay at 2
    me = claim("a", minimum=1, held=3)
    starved = claim("b", minimum=1, held=0, starved=True)
    assert shared_desired(me, [starved], desired=3, free=0, compatible=same) == 2
    # once the starved job holds its pod it lacks nothing: the donor may want its spec
    # again, and only free capacity (none here) would let it grow
    fed = claim("b", minimum=1, held=1, starved=True)
    assert shared_desired(claim("a", minimum=1, held=2), [fed], desired=3, free=0,
                          compatible=same) == 3  # fmt: skip


def test_largest_surplus_gives_first_and_each_donor_computes_the_same() -> None:
    a = claim("a", minimum=1, held=5)
    b = claim("b", minimum=2, held=3)
    s = claim("s", minimum=2, held=0, starved=True)
    assert shared_desired(a, [b, s], desired=5, free=0, compatible=same) == 3
    assert shared_desired(b, [a, s], desired=3, free=0, compatible=same) == 3


def test_never_below_own_minimum_and_other_types_untouched() -> None:
    me = claim("a", minimum=2, held=2)
    starved = claim("b", minimum=4, held=0, starved=True)
    assert shared_desired(me, [starved], desired=4, free=0, compatible=same) == 2
    other = Claim("c", minimum=1, held=0, starved=True, gpu_types=frozenset({"T4"}))
    assert shared_desired(claim("a", minimum=1, held=3), [other], desired=3, free=0,
                          compatible=same) == 3  # fmt: skip
