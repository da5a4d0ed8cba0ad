"""Cross-field rules stated once, enforced twice: by the API server (CEL) and by pydantic.

A rule pairs a CEL expression (emitted into the CRD as ``x-kubernetes-validations``) with a
Python predicate over the same model and the same message, so the API server and
``elastra plan`` reject a bad spec with the same words. The shared case table in
``tests/cases/specs.py`` goes to both judges (unit tests: pydantic; integration tests: a real
API server), which is how they are kept in agreement.

Transition rules (``oldSelf``) guard immutable fields; they exist only on the server side,
because the Python side never sees the previous object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """One cross-field invariant of a model.

    ``field`` is the path (relative to the model the rule sits on) that the message blames,
    written the way Kubernetes reports it (``.minReplicas``); ``check`` is ``None`` for
    transition rules, which only the API server can evaluate.
    """

    cel: str
    message: str
    check: Callable[[Any], bool] | None = None
    field: str | None = None

    def as_cel(self) -> dict[str, str]:
        """The ``x-kubernetes-validations`` entry for this rule."""
        entry = {"rule": self.cel, "message": self.message}
        if self.field is not None:
            entry["fieldPath"] = self.field
        return entry


def immutable(field: str, why: str, *, parent: str = "") -> Rule:
    """A transition rule that forbids changing an optional field once the object exists.

    Written on the parent so that adding or removing the field counts as a change too (a
    rule on the field itself only runs when both old and new values are present).
    ``parent`` is the dotted path of the model the rule sits on, for the message.
    """
    present_same = f"has(self.{field}) == has(oldSelf.{field})"
    value_same = f"(!has(self.{field}) || self.{field} == oldSelf.{field})"
    return Rule(
        cel=f"{present_same} && {value_same}",
        message=f"{parent}{field} is immutable: {why}",
        field=f".{field}",
    )
