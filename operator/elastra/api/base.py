"""The base every API model shares: camelCase on the wire, snake_case in Python.

Kubernetes objects are camelCase; Python code reads better in snake_case. Aliases bridge the
two, ``extra="forbid"`` turns a misspelt field into an error that names it, and models are
frozen because the controller and planner treat a parsed spec as a value, never a buffer.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, GetJsonSchemaHandler, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from elastra.api.rules import Rule


class ApiModel(BaseModel):
    """A frozen, camelCase-aliased model whose ``RULES`` are checked after field validation."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Any:
        for rule in self.RULES:
            if rule.check is not None and not rule.check(self):
                raise ValueError(_prefixed(rule))
        return self

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """Carry ``RULES`` into the JSON schema as CEL, so the CRD enforces them too."""
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        rules = [rule.as_cel() for rule in cls.RULES]
        if rules:
            target["x-kubernetes-validations"] = rules
        return schema

    def to_wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _prefixed(rule: Rule) -> str:
    """Make a rule message carry its field so a pydantic error reads like the server's.

    pydantic reports a model-level error at the model's own path; the rule's ``field`` adds
    the member that is actually wrong.
    """
    if rule.field is None:
        return rule.message
    return f"[{rule.field.lstrip('.')}] {rule.message}"
