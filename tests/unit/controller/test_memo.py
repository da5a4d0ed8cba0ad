"""memo: values derived from the shared listings, computed again only for what changed."""

from __future__ import annotations

from elastra.controller.decide.memo import LastOf, LastOfAll, PerKeyOf, PerObject


def test_last_of_computes_again_only_for_a_new_tuple() -> None:
    calls: list[tuple[int, ...]] = []
    memo: LastOf[tuple[int, ...], int] = LastOf()

    def total(values: tuple[int, ...]) -> int:
        calls.append(values)
        return sum(values)

    listing = (1, 2)
    assert memo.get(listing, total) == 3
    assert memo.get(listing, total) == 3
    assert memo.get((1, 2, 3), total) == 6
    assert len(calls) == 2


def test_last_of_never_caches_a_list() -> None:
    memo: LastOf[list[int], int] = LastOf()
    values = [1]
    assert memo.get(values, sum) == 1
    values.append(2)
    assert memo.get(values, sum) == 3


def test_per_object_computes_only_objects_it_did_not_hold() -> None:
    seen: list[str] = []

    def name(obj: dict[str, str]) -> str:
        seen.append(obj["name"])
        return obj["name"].upper()

    memo = PerObject(name)
    a, b = {"name": "a"}, {"name": "b"}
    assert memo.map([a, b]) == ["A", "B"]
    b2 = {"name": "b2"}  # b replaced by its next version, as an informer does
    assert memo.map([a, b2, a]) == ["A", "B2", "A"]
    assert seen == ["a", "b", "b2"]


def test_per_object_tells_an_equal_new_object_from_the_one_it_holds() -> None:
    """Identity, not equality: an object built anew is computed anew."""
    memo: PerObject[dict[str, str], dict[str, str]] = PerObject(dict)
    first = {"phase": "Running"}
    kept = memo.map([first])[0]
    again = memo.map([{"phase": "Running"}])[0]
    assert kept == again and kept is not again


def test_last_of_all_computes_again_when_any_key_is_another_object() -> None:
    memo: LastOfAll[int] = LastOfAll()
    calls = 0

    def compute() -> int:
        nonlocal calls
        calls += 1
        return calls

    a, b = tuple([1]), tuple([2])
    assert memo.get((a, b), compute) == 1
    assert memo.get((a, b), compute) == 1
    assert memo.get((a, tuple([2])), compute) == 2, "an equal but new object is a new key"
    assert memo.get((a,), compute) == 3


def test_per_key_of_keeps_a_value_per_key_while_the_owners_stay() -> None:
    calls: list[str] = []
    memo: PerKeyOf[str, str] = PerKeyOf(limit=2)

    def compute(key: str) -> str:
        calls.append(key)
        return key.upper()

    listing, other = tuple([1]), tuple([1])
    assert memo.get((listing,), "a", lambda: compute("a")) == "A"
    assert memo.get((listing,), "b", lambda: compute("b")) == "B"
    assert memo.get((listing,), "a", lambda: compute("a")) == "A"
    assert calls == ["a", "b"]
    memo.get((listing,), "c", lambda: compute("c"))  # over the limit: "a" goes
    memo.get((listing,), "a", lambda: compute("a"))
    assert calls == ["a", "b", "c", "a"]
    memo.get((other,), "a", lambda: compute("a"))  # equal but not the same owner: all go
    assert calls[-1] == "a" and len(calls) == 5
