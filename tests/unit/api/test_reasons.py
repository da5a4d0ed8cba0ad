"""One reason vocabulary: every reason Elastra writes is a ``Reason`` member, and no module
spells one as a string of its own (where two spellings could drift apart)."""

from __future__ import annotations

import ast
from pathlib import Path

from elastra.api import ConditionType, Phase, Reason

OPERATOR = Path(__file__).resolve().parents[3] / "operator" / "elastra"

OTHER_WORDS: dict[str, set[str]] = {
    # Condition types and phases that are also reasons' words ("Suspended" is all three).
    "api/status.py": {c.value for c in ConditionType} | {p.value for p in Phase},
    # PodScheduled's reason, as kube-scheduler writes it: Kubernetes' word, read, not written.
    "controller/decide/observe.py": {"Unschedulable"},
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            found.add(id(body[0].value))
    return found


def spelled_out(source: str, module: str) -> list[tuple[int, str]]:
    """(line, word) of every string constant in ``source`` (of ``module``, a path under
    ``elastra/``) that is a reason's value."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    words = {r.value for r in Reason} - OTHER_WORDS.get(module, set())
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in words
        and id(node) not in docstrings
    ]


def test_no_module_spells_a_reason_of_its_own() -> None:
    found = {
        f"{path.relative_to(OPERATOR)}:{line}": word
        for path in sorted(OPERATOR.rglob("*.py"))
        if path.name != "reasons.py"
        for line, word in spelled_out(path.read_text(), str(path.relative_to(OPERATOR)))
    }
    assert found == {}, "use elastra.api.Reason"


def test_the_check_finds_a_reason_spelled_out() -> None:
    source = '"""Doc: WorldFormed."""\nREASON = "WorldFormed"\nSEEN = "Unschedulable"\n'
    assert spelled_out(source, "controller/decide/verdicts.py") == [
        (2, "WorldFormed"),
        (3, "Unschedulable"),
    ]
    assert spelled_out(source, "controller/decide/observe.py") == [(2, "WorldFormed")]


def test_reasons_are_one_camel_case_word_each_spelled_once() -> None:
    values = [r.value for r in Reason]
    assert len(values) == len(set(values))
    assert all(v[:1].isupper() and v.isalnum() for v in values)
