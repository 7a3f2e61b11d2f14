"""What the model must answer: the output models, the request's JSON schema, and the check of
an answer against it.

The types come from the graph schema (tasks/graph/ontology.py, schemas/graph.toml). Labels that
reach Cypher come only from it; model output is mapped onto them (or rejected and counted),
never interpolated.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr

from tasks.graph.ontology import GraphSchema, default_schema

# The shipped schema's types (schemas/graph.toml), for code and benchmarks that need no other.
ENTITY_TYPES: tuple[str, ...] = default_schema().entity_types
RELATIONSHIP_TYPES: tuple[str, ...] = default_schema().relationship_types
FALLBACK_RELATIONSHIP = default_schema().fallback


def map_entity_type(raw: str, ontology: GraphSchema | None = None) -> str | None:
    """The schema's entity label for a model-written type, or None (rejected)."""
    return (ontology or default_schema()).map_entity_type(raw)


def map_relationship_type(raw: str, ontology: GraphSchema | None = None) -> tuple[str, bool]:
    """The schema's relationship type and whether it had to fall back (RELATED_TO)."""
    return (ontology or default_schema()).map_relationship_type(raw)


class ExtractedEntity(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    type: str
    description: str = ""
    properties: dict[str, str] = {}  # the graph schema's optional properties, when it has any


class ExtractedRelationship(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str
    target: str
    type: str
    description: str = ""


@dataclass
class Repairs:
    """What was mended on the way in, counted in the phase-1 summary (never model output)."""

    dropped_fields: Counter[str] = field(default_factory=Counter)  # "entities[].confidence"
    rejected_entity_types: Counter[str] = field(default_factory=Counter)
    remapped_relationship_types: Counter[str] = field(default_factory=Counter)


class Extraction(BaseModel):
    """What the model must return for one chunk."""

    model_config = ConfigDict(extra="forbid")
    entities: list[ExtractedEntity] = []
    relationships: list[ExtractedRelationship] = []
    _repairs: Repairs = PrivateAttr(default_factory=Repairs)

    @property
    def repairs(self) -> Repairs:
        return self._repairs


def json_schema(max_entities: int, max_relationships: int, max_name: int = 80,
                max_description: int = 160, ontology: GraphSchema | None = None
                ) -> dict[str, Any]:
    """The response schema with bounds, so a grammar-constrained model cannot ramble; its
    enums are the graph schema's types."""
    ontology = ontology or default_schema()

    def text(n: int) -> dict[str, Any]:
        return {"type": "string", "maxLength": n}

    entity_fields: dict[str, Any] = {
        "name": text(max_name),
        "type": {"type": "string", "enum": list(ontology.entity_types)},
        "description": text(max_description),
    }
    if ontology.property_names():  # asked for only when the schema declares some
        entity_fields["properties"] = {
            "type": "object", "additionalProperties": False,
            "properties": {p: text(max_description) for p in ontology.property_names()}}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["entities", "relationships"],
        "properties": {
            "entities": {
                "type": "array",
                "maxItems": max_entities,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name", "type", "description"],
                    "properties": entity_fields,
                },
            },
            "relationships": {
                "type": "array",
                "maxItems": max_relationships,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["source", "target", "type", "description"],
                    "properties": {
                        "source": text(max_name),
                        "target": text(max_name),
                        "type": {"type": "string", "enum": list(ontology.relationship_types)},
                        "description": text(max_description),
                    },
                },
            },
        },
    }


class SchemaViolation(ValueError):
    """An answer breaks a bound of the schema its request sent; `bound` ("entities: maxItems")
    is the counter key, the message names the place, the size and the limit."""

    def __init__(self, where: str, keyword: str, detail: str) -> None:
        super().__init__(f"{where or '(answer)'}: {detail}")
        self.bound = f"{_generic(where) or '(answer)'}: {keyword}"


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "integer": (int,),
    "number": (int, float), "boolean": (bool,), "null": (type(None),)}
_REJECT = object()  # an array item whose label maps onto nothing in the enum: dropped, counted


def _generic(where: str) -> str:
    """entities[3].name → entities[].name: one counter key per place, not per item."""
    return re.sub(r"\[\d+\]", "[]", where)


def _is(value: Any, want: str | list[str]) -> bool:
    wants = [want] if isinstance(want, str) else want
    if isinstance(value, bool):  # a JSON boolean is no integer, though Python says so
        return "boolean" in wants
    return any(isinstance(value, _TYPES.get(w, (object,))) for w in wants)


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return next((n for n, t in _TYPES.items() if isinstance(value, t)), type(value).__name__)


def _relabel(where: str, value: Any, enum: list[Any], repairs: Repairs,
             ontology: GraphSchema) -> Any:
    """A type label outside the sent enum: mapped onto it, or the item is dropped (counted).
    The labels are repairable, so one odd label costs one item, not the chunk's answer."""
    path = _generic(where)
    if path == "entities[].type" and isinstance(value, str):
        label = ontology.map_entity_type(value)
        if label in enum:
            return label
        repairs.rejected_entity_types[value or "(empty)"] += 1
        return _REJECT
    if path == "relationships[].type" and isinstance(value, str):
        rtype, fell_back = ontology.map_relationship_type(value)
        if rtype in enum:
            if fell_back:
                repairs.remapped_relationship_types[value] += 1
            return rtype
    raise SchemaViolation(where, "enum", f"{value!r} is not one of {enum}")


def _enforce(value: Any, schema: dict[str, Any], where: str, repairs: Repairs,
             ontology: GraphSchema) -> Any:
    """`value` held to `schema`: type, enum, maxLength, maxItems, required; properties the schema
    closes (additionalProperties: false) are dropped and counted instead of failing the answer."""
    want = schema.get("type")
    if want and not _is(value, want):
        raise SchemaViolation(where, "type", f"expected {want}, got {_json_type(value)}")
    if "enum" in schema and value not in schema["enum"]:
        return _relabel(where, value, schema["enum"], repairs, ontology)
    if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
        raise SchemaViolation(where, "maxLength", f"{len(value)} characters > maxLength "
                                                  f"{schema['maxLength']}")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            raise SchemaViolation(where, "maxItems", f"{len(value)} items > maxItems "
                                                     f"{schema['maxItems']}")
        if "items" in schema:
            checked = (_enforce(v, schema["items"], f"{where}[{i}]", repairs, ontology)
                       for i, v in enumerate(value))
            value = [v for v in checked if v is not _REJECT]
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                raise SchemaViolation(where, "required", f"'{key}' is required but missing")
        props = schema.get("properties", {})
        out = {}
        for key, v in value.items():
            if key in props:
                out[key] = _enforce(v, props[key], f"{where}.{key}" if where else key, repairs,
                                    ontology)
                if out[key] is _REJECT:
                    return _REJECT
            elif schema.get("additionalProperties", True) is False:
                where_key = _generic(where)
                repairs.dropped_fields[f"{where_key}.{key}" if where_key else key] += 1
            else:
                out[key] = v
        value = out
    return value


def parse_answer(data: Any, schema: dict[str, Any], ontology: GraphSchema | None = None
                 ) -> Extraction:
    """The model's JSON held to every bound of the schema its request sent (the grammar may not
    have: see tests/fakes/openai_server.py), then validated. Raises SchemaViolation (unusable output:
    retried, then dead-lettered) or pydantic's ValidationError."""
    repairs = Repairs()
    checked = _enforce(data, schema, "", repairs, ontology or default_schema())
    if checked is _REJECT:
        raise SchemaViolation("", "enum", "the answer's only label is outside the schema")
    ex = Extraction.model_validate(checked)
    ex._repairs = repairs
    return ex
