"""What a status write changes, by field: the operator's debug log names it for each write.

Why: a job's status is written a few times per world (docs/architecture.md, step 4), and a
write beyond those is an API request on a shared server that someone pays for. Counting
writes says that there are more; this says which field brought each one (a count, a
condition's reason, the progress), which is what deciding about pacing needs.

Pure: two statuses as written to the API (``TrainingJobStatus.to_wire``) in, names out.
"""

from __future__ import annotations

from typing import Any

JsonDict = dict[str, Any]


def changed_fields(before: JsonDict, after: JsonDict) -> list[str]:
    """The fields that differ: top-level names, ``conditions.<Type>.<field>`` for conditions.

    A condition that appears or goes is named by its type alone (``conditions.Resizing``).
    """
    names: list[str] = []
    for key in sorted(before.keys() | after.keys()):
        if key == "conditions":
            names += _condition_changes(before.get(key) or [], after.get(key) or [])
        elif before.get(key) != after.get(key):
            names.append(key)
    return names


def _condition_changes(before: list[JsonDict], after: list[JsonDict]) -> list[str]:
    old = {str(c.get("type")): c for c in before}
    new = {str(c.get("type")): c for c in after}
    names: list[str] = []
    for kind in sorted(old.keys() | new.keys()):
        if kind not in old or kind not in new:
            names.append(f"conditions.{kind}")
            continue
        fields = sorted(old[kind].keys() | new[kind].keys())
        names += [f"conditions.{kind}.{f}" for f in fields if old[kind].get(f) != new[kind].get(f)]
    return names
