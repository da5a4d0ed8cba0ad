"""The TrainingJob object as a whole, and parsing it from YAML with one-line errors.

Parsing happens once, at the edge (typed past it): the controller parses the body it is
handed, ``elastra plan`` parses the file it is given, and everything past this point sees
typed models. A user mistake becomes a ``UserError`` whose message names the file and the
field, the way the API server would, never a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from elastra.api.formats import PATTERN_HINTS
from elastra.api.status import TrainingJobStatus
from elastra.api.trainingjob import TrainingJobSpec
from elastra.errors import UserError

GROUP = "elastra.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingJob"
PLURAL = "trainingjobs"


class ObjectMeta(BaseModel):
    """The parts of metadata Elastra reads; the rest is kept but not interpreted."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = Field(default=None, alias="resourceVersion")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class TrainingJob(BaseModel):
    """A whole TrainingJob object: apiVersion, kind, metadata, spec and status."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: Literal["elastra.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["TrainingJob"]
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TrainingJobSpec
    status: TrainingJobStatus = Field(default_factory=TrainingJobStatus)


def parse_trainingjob(body: Mapping[str, Any], *, source: str = "TrainingJob") -> TrainingJob:
    """Parse a TrainingJob body; raise ``UserError`` naming ``source`` and the bad field."""
    try:
        return TrainingJob.model_validate(dict(body))
    except ValidationError as err:
        raise UserError(f"{source}: {describe_validation_error(err)}") from None


def load_trainingjob(path: str | Path) -> TrainingJob:
    """Read a TrainingJob from a YAML file (the first TrainingJob document in it)."""
    path = Path(path)
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except OSError as err:
        raise UserError(f"{path}: cannot read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML: {_first_line(str(err))}") from None
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == KIND:
            return parse_trainingjob(document, source=str(path))
    raise UserError(f"{path}: no document with kind: {KIND} (apiVersion: {API_VERSION})")


def describe_validation_error(err: ValidationError) -> str:
    """All of pydantic's complaints as ``field.path: message`` joined by ``; ``."""
    return "; ".join(_describe(e) for e in err.errors(include_url=False))


def _describe(error: Any) -> str:
    path = ".".join(str(p) for p in error["loc"])
    message: str = error["msg"]
    kind: str = error["type"]
    ctx: dict[str, Any] = error.get("ctx") or {}
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
        if message.startswith("["):
            member, _, message = message[1:].partition("] ")
            path = f"{path}.{member}" if path else member
    elif kind == "extra_forbidden":
        message = "unknown field (check its spelling and nesting against the API reference)"
    elif kind == "missing":
        message = "required field is missing"
    elif kind in {"literal_error", "enum"}:
        message = f"unsupported value {error['input']!r}: supported values: {ctx['expected']}"
    elif kind == "string_pattern_mismatch":
        wanted = PATTERN_HINTS.get(ctx["pattern"], f"a string matching {ctx['pattern']}")
        message = f"{error['input']!r} should match pattern: {wanted}"
    elif kind in _BOUND_ERRORS:
        message = f"{message} (got {_short(error['input'])})"
    return f"{path}: {message}" if path else message


_BOUND_ERRORS = frozenset(
    {"greater_than_equal", "less_than_equal", "string_too_long", "string_too_short", "too_long"}
)


def _short(value: Any) -> str:
    if isinstance(value, list | dict):
        return f"{len(value)} items"
    if isinstance(value, str) and len(value) > 40:
        return f"{len(value)} characters"
    return repr(value)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
