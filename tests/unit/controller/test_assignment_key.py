"""The key pair of pushed assignments: one per seed, so a restarted operator (or another
replica of the chart) signs as the pods of running jobs expect."""

from __future__ import annotations

from elastra.api import parse_trainingjob
from elastra.controller.decide.assignment_key import signing_key
from elastra.controller.decide.manifests import assignment_json
from elastra.controller.settings import OperatorSettings
from elastra_worker.push import PushedAssignments, public_key_text, sign
from tests.cases.specs import base_manifest

SEED = b"48 random characters, as the chart's Secret holds"


def test_one_seed_gives_one_key_pair_and_another_seed_another() -> None:
    assert public_key_text(signing_key(SEED)) == public_key_text(signing_key(bytes(SEED)))
    assert public_key_text(signing_key(SEED)) != public_key_text(signing_key(SEED + b"!"))


def test_without_a_seed_each_run_makes_its_own_key_pair() -> None:
    assert public_key_text(signing_key(b"")) != public_key_text(signing_key(b""))


def test_a_push_signed_after_a_restart_is_taken_by_a_pod_made_before_it() -> None:
    """The pod's environment holds the public key of the operator that created it."""
    pod = PushedAssignments(public_key_text(signing_key(SEED)), "uid-1")
    restarted = signing_key(SEED)
    body = assignment_json(
        parse_trainingjob(base_manifest()),
        version=4,
        rank=None,
        stop=False,
        settings=OperatorSettings(),
    ).encode()
    assert pod.accept(body, sign(restarted, "uid-1", body)) == (200, "taken")
