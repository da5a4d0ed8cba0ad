"""Sharing a scarce type: minimums first, by priority, in scope, no livelock, no double giving."""

from __future__ import annotations

import pytest

from elastra.elastic.share import (
    Claim,
    Priorities,
    Scope,
    gifts,
    may_give,
    shared_desired,
)


def same(pattern: str, type_name: str) -> bool:
    return pattern == type_name


def claim(
    key: str,
    *,
    minimum: int,
    held: int,
    starved: bool = False,
    priority: int = 0,
    gpu: str = "H200",
) -> Claim:
    """A claim; ``key`` without a slash is put in namespace ``team-a``."""
    return Claim(
        key=key if "/" in key else f"team-a/{key}",
        minimum=minimum,
        held=held,
        starved=starved,
        gpu_types=frozenset({gpu}),
        priority=priority,
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
    other = claim("c", minimum=1, held=0, starved=True, gpu="T4")
    assert shared_desired(claim("a", minimum=1, held=3), [other], desired=3, free=0,
                          compatible=same) == 3  # fmt: skip


# --- priorities and scope: one donor (held 4, minimum 1), one starved job (lacks 2) ---------


@pytest.mark.parametrize(
    ("donor", "starved", "scope", "want"),
    [
        # priorities: lower gives to higher, equal shares, higher never gives to lower
        (claim("low", minimum=1, held=4, priority=0),
         claim("high", minimum=2, held=0, starved=True, priority=1000), Scope.NAMESPACE, 2),
        (claim("peer", minimum=1, held=4, priority=5),
         claim("other", minimum=2, held=0, starved=True, priority=5), Scope.NAMESPACE, 2),
        (claim("high", minimum=1, held=4, priority=1000),
         claim("low", minimum=2, held=0, starved=True, priority=0), Scope.NAMESPACE, 4),
        (claim("high", minimum=1, held=4, priority=1000),
         claim("low", minimum=2, held=0, starved=True, priority=0), Scope.CLUSTER, 4),
        # negative values are priorities too (below the default 0)
        (claim("batch", minimum=1, held=4, priority=-10),
         claim("plain", minimum=2, held=0, starved=True, priority=0), Scope.NAMESPACE, 2),
        # namespaces: another namespace's starved job gets GPUs only cluster-wide
        (claim("team-a/x", minimum=1, held=4),
         claim("team-b/y", minimum=2, held=0, starved=True), Scope.NAMESPACE, 4),
        (claim("team-a/x", minimum=1, held=4),
         claim("team-b/y", minimum=2, held=0, starved=True), Scope.CLUSTER, 2),
        (claim("team-a/x", minimum=1, held=4, priority=9),
         claim("team-b/y", minimum=2, held=0, starved=True, priority=1), Scope.CLUSTER, 4),
        # off: nobody gives, even to a higher priority in the same namespace
        (claim("low", minimum=1, held=4),
         claim("high", minimum=2, held=0, starved=True, priority=1000), Scope.OFF, 4),
    ],
    ids=[
        "lower-gives-to-higher",
        "equal-priority-shares",
        "higher-never-gives-to-lower",
        "higher-never-gives-to-lower-cluster-wide",
        "negative-gives-to-default",
        "namespace-scope-keeps-other-namespaces-out",
        "cluster-scope-gives-across-namespaces",
        "cluster-scope-still-by-priority",
        "off",
    ],
)  # fmt: skip
def test_who_may_give_to_whom(donor: Claim, starved: Claim, scope: Scope, want: int) -> None:
    got = shared_desired(donor, [starved], desired=4, free=0, compatible=same, scope=scope)
    assert got == want
    allowed = may_give(donor, starved, scope=scope, compatible=same)
    assert allowed == (want < 4), "may_give says the same as the size"


def test_a_donor_that_may_not_give_still_grows_while_others_wait() -> None:
    """A starved job of lower priority (or outside the scope) does not hold a donor back."""
    high = claim("high", minimum=1, held=2, priority=10)
    low = claim("low", minimum=2, held=0, starved=True)
    assert shared_desired(high, [low], desired=4, free=2, compatible=same) == 4


# --- lowest priority first, then largest surplus, then name ---------------------------------


@pytest.mark.parametrize(
    ("donors", "starved", "free", "want"),
    [
        # the lowest priority gives first, even with the smaller surplus
        ([claim("a", minimum=1, held=5, priority=5), claim("b", minimum=1, held=2, priority=0)],
         [claim("s", minimum=2, held=0, starved=True, priority=10)], 0,
         {"team-a/b": 1, "team-a/a": 1}),
        # equal priority: the largest surplus, then the name
        ([claim("a", minimum=1, held=3), claim("b", minimum=1, held=4)],
         [claim("s", minimum=2, held=0, starved=True)], 0,
         {"team-a/b": 2}),
        ([claim("b", minimum=1, held=3), claim("a", minimum=1, held=3)],
         [claim("s", minimum=1, held=0, starved=True)], 0,
         {"team-a/a": 1}),
        # the highest-priority starved job is served first, from the lowest donors it may
        # use; "mid" outranks "bottom", so it keeps its surplus and "bottom" waits
        ([claim("mid", minimum=1, held=2, priority=5), claim("low", minimum=1, held=2)],
         [claim("top", minimum=1, held=0, starved=True, priority=9),
          claim("bottom", minimum=1, held=0, starved=True, priority=0)], 0,
         {"team-a/low": 1}),
        # free pods go to the highest-priority starved job first
        ([claim("low", minimum=1, held=3)],
         [claim("top", minimum=1, held=0, starved=True, priority=9),
          claim("next", minimum=1, held=0, starved=True, priority=1)], 1,
         {"team-a/low": 1}),
        # no donor gives more than its surplus, however much is lacking
        ([claim("a", minimum=2, held=3), claim("b", minimum=1, held=2)],
         [claim("s", minimum=8, held=0, starved=True)], 0,
         {"team-a/a": 1, "team-a/b": 1}),
    ],
    ids=[
        "lowest-priority-first",
        "largest-surplus-among-equals",
        "name-breaks-ties",
        "highest-starved-first",
        "free-to-highest-starved",
        "at-most-the-surplus",
    ],
)  # fmt: skip
def test_gifts_order(
    donors: list[Claim], starved: list[Claim], free: int, want: dict[str, int]
) -> None:
    got = gifts([*starved, *donors], free=free, scope=Scope.NAMESPACE, compatible=same)
    assert got == want


def test_every_donor_computes_the_same_split() -> None:
    """Each donor's own pass gives exactly what the global split assigns it: no livelock."""
    donors = [
        claim("a", minimum=1, held=4, priority=0),
        claim("b", minimum=1, held=4, priority=0),
        claim("c", minimum=1, held=4, priority=7),
        claim("d", minimum=1, held=4, priority=20),
    ]
    starved = [
        claim("s1", minimum=5, held=0, starved=True, priority=10),
        claim("s2", minimum=3, held=0, starved=True, priority=0),
    ]
    split = gifts([*donors, *starved], free=0, scope=Scope.NAMESPACE, compatible=same)
    # s1 is fed from a and b (the lowest); s2 gets b's last pod and waits for 2 more, as c
    # and d outrank it
    assert split == {"team-a/a": 3, "team-a/b": 3}
    for me in donors:
        others = [c for c in [*donors, *starved] if c.key != me.key]
        size = shared_desired(me, others, desired=4, free=0, compatible=same)
        assert size == 4 - split.get(me.key, 0), me.key


# --- priorities as Kubernetes resolves them -------------------------------------------------


@pytest.mark.parametrize(
    ("classes", "name", "want"),
    [
        ([], None, 0),  # no class anywhere: 0
        ([("high", 1000, False)], "high", 1000),
        ([("high", 1000, False)], None, 0),
        ([("high", 1000, False), ("normal", 100, True)], None, 100),  # the global default
        ([("high", 1000, False), ("normal", 100, True)], "high", 1000),
        ([("a", 50, True), ("b", 20, True)], None, 20),  # several defaults: the smallest
        ([("high", 1000, False)], "missing", None),  # its pods would be refused
    ],
)
def test_priorities_resolve_as_kubernetes_does(
    classes: list[tuple[str, int, bool]], name: str | None, want: int | None
) -> None:
    assert Priorities.of_classes(classes).of(name) == want
