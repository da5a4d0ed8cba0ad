"""The install checks of the e2e suite, judged without a cluster: each can fail.

Why: `rbac_against_golden` and `denials` decide whether the suite's RBAC and Pod Security
tests pass; a comparison that ignored a verb, or a filter that matched nothing, would let a
wrong chart through.
"""

from __future__ import annotations

from e2e.install import denials, expand_rules


def test_rules_expand_to_single_permissions_whatever_their_grouping() -> None:
    grouped = [{"apiGroups": [""], "resources": ["pods", "services"], "verbs": ["get", "list"]}]
    split = [
        {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    assert expand_rules(grouped) == expand_rules(split)
    assert len(expand_rules(grouped)) == 4


def test_an_extra_verb_or_name_is_a_different_permission() -> None:
    base = [{"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings"], "verbs": ["patch"]}]
    named = [{**base[0], "resourceNames": ["elastra"]}]
    wider = [{**base[0], "verbs": ["patch", "delete"]}]
    assert expand_rules(named) != expand_rules(base)
    assert expand_rules(wider) - expand_rules(base) == {
        ("kopf.dev", "clusterkopfpeerings", "", "delete")
    }


def test_denials_find_admission_refusals_and_nothing_else() -> None:
    text = "\n".join(
        [
            "Handler 'job_event' succeeded.",
            'W1130 Warning: would violate PodSecurity "restricted:latest": hostPath volumes',
            'pods "x" is forbidden: violates PodSecurity "restricted:latest"',
            "lease elastra-system/elastra-operator: acquired, reconciling",
        ]
    )
    assert len(denials(text)) == 2
    assert denials("Handler 'pod_event' succeeded.\n") == []
