"""Reading TrainingJobs from files: every mistake is one line that names the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from elastra.api import load_trainingjob
from elastra.errors import UserError

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize("name", ["cpu-tiny.yaml", "gpt-7b-hetero.yaml"])
def test_examples_parse(name: str) -> None:
    job = load_trainingjob(EXAMPLES / name)
    assert job.metadata.name == name.removesuffix(".yaml")


def test_gpt_7b_example_is_heterogeneous() -> None:
    spec = load_trainingjob(EXAMPLES / "gpt-7b-hetero.yaml").spec
    assert spec.placement.heterogeneous is True
    assert len(spec.worker.gpu_types) >= 2
    assert spec.model is not None and spec.model.layers == 32


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"nope\.yaml: cannot read"):
        load_trainingjob(tmp_path / "nope.yaml")


def test_broken_yaml(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("spec: [unclosed\n")
    with pytest.raises(UserError, match=r"job\.yaml: not valid YAML"):
        load_trainingjob(path)


def test_no_trainingjob_document(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod"}))
    with pytest.raises(UserError, match="no document with kind: TrainingJob"):
        load_trainingjob(path)


def test_picks_the_trainingjob_among_documents(tmp_path: Path) -> None:
    job = yaml.safe_load((EXAMPLES / "cpu-tiny.yaml").read_text())
    path = tmp_path / "bundle.yaml"
    path.write_text(yaml.safe_dump_all([{"apiVersion": "v1", "kind": "Namespace"}, job]))
    assert load_trainingjob(path).metadata.name == "cpu-tiny"


def test_wrong_api_version_names_the_field(tmp_path: Path) -> None:
    job = yaml.safe_load((EXAMPLES / "cpu-tiny.yaml").read_text())
    job["apiVersion"] = "elastra.dev/v1"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    with pytest.raises(UserError, match=r"apiVersion: unsupported value 'elastra.dev/v1'"):
        load_trainingjob(path)


def test_misspelt_field_is_named(tmp_path: Path) -> None:
    job = yaml.safe_load((EXAMPLES / "cpu-tiny.yaml").read_text())
    job["spec"]["worker"]["gpu"] = 1
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    with pytest.raises(UserError, match=r"spec\.worker\.gpu: unknown field"):
        load_trainingjob(path)
