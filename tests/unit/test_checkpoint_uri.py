"""The operator hands ``spec.checkpoint.uri`` to every worker in its assignment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from elastra.api import parse_trainingjob
from elastra.controller.decide.manifests import RankSpec, assignment_json
from elastra.controller.settings import OperatorSettings
from elastra_worker.assignment import ParallelPlan, parse_assignment

EXAMPLE = Path(__file__).parents[2] / "examples" / "cpu-tiny.yaml"


def wire(checkpoint: dict[str, Any]) -> dict[str, Any]:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["checkpoint"] = checkpoint
    job = parse_trainingjob(body)
    rank = RankSpec(rank=0, world_size=1, master_addr="w0", plan=ParallelPlan(dp=1))
    text = assignment_json(job, version=1, rank=rank, stop=False, settings=OperatorSettings())
    return dict(json.loads(text))


def test_the_uri_reaches_the_worker() -> None:
    sent = wire({"uri": "s3://bucket/team/ckpt/", "keep": 4})
    assert sent["checkpoint"]["uri"] == "s3://bucket/team/ckpt/"
    got = parse_assignment(sent).checkpoint
    assert (got.uri, got.keep) == ("s3://bucket/team/ckpt", 4)  # normalised by the worker


def test_no_uri_leaves_the_assignment_as_before() -> None:
    sent = wire({"volume": "claim"})
    assert "uri" not in sent["checkpoint"]
    assert parse_assignment(sent).checkpoint.uri == ""
