"""The extraction schema, in one place: type whitelists, LLM output models, JSON schema.

Labels that reach Cypher come only from ENTITY_TYPES and RELATIONSHIP_TYPES; model output
is mapped onto them (or rejected and counted), never interpolated.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

ENTITY_TYPES: tuple[str, ...] = (
    "Person",
    "Organization",
    "Project",
    "Topic",
    "Decision",
    "Product",
    "Location",
    "Event",
)
RELATIONSHIP_TYPES: tuple[str, ...] = (
    "WORKS_FOR",
    "MEMBER_OF",
    "PARTICIPATED_IN",
    "DECIDED",
    "OWNS",
    "LOCATED_IN",
    "PART_OF",
    "RELATED_TO",
)
FALLBACK_RELATIONSHIP = "RELATED_TO"
# Bump when the prompt, schema or deterministic mapping changes: documents extracted under an
# older version are re-extracted on the next run.
PROMPT_VERSION = "p1"

_ENTITY_SYNONYMS = {
    "person": "Person", "people": "Person", "individual": "Person", "speaker": "Person",
    "member": "Person", "minister": "Person", "politician": "Person", "participant": "Person",
    "organization": "Organization", "organisation": "Organization", "company": "Organization",
    "org": "Organization", "institution": "Organization", "agency": "Organization",
    "committee": "Organization", "government": "Organization", "party": "Organization",
    "team": "Organization", "department": "Organization", "university": "Organization",
    "project": "Project", "initiative": "Project", "programme": "Project", "program": "Project",
    "topic": "Topic", "subject": "Topic", "issue": "Topic", "theme": "Topic", "concept": "Topic",
    "policy": "Topic", "bill": "Topic", "law": "Topic",
    "decision": "Decision", "resolution": "Decision", "motion": "Decision",
    "product": "Product", "device": "Product", "tool": "Product", "software": "Product",
    "location": "Location", "place": "Location", "city": "Location", "country": "Location",
    "region": "Location", "province": "Location",
    "event": "Event", "meeting": "Event", "session": "Event", "conference": "Event",
}
_REL_SYNONYMS = {
    "EMPLOYED_BY": "WORKS_FOR", "WORKS_AT": "WORKS_FOR", "EMPLOYEE_OF": "WORKS_FOR",
    "BELONGS_TO": "MEMBER_OF", "PART_OF_TEAM": "MEMBER_OF",
    "ATTENDED": "PARTICIPATED_IN", "SPOKE_AT": "PARTICIPATED_IN", "PRESENTED_AT": "PARTICIPATED_IN",
    "MADE_DECISION": "DECIDED", "APPROVED": "DECIDED",
    "OWNED_BY": "OWNS", "HAS": "OWNS",
    "BASED_IN": "LOCATED_IN", "IN": "LOCATED_IN",
    "SUBPART_OF": "PART_OF",
}


def map_entity_type(raw: str) -> str | None:
    """Whitelisted entity label for a model-written type, or None (rejected)."""
    if raw in ENTITY_TYPES:
        return raw
    word = re.sub(r"[^a-z]", "", raw.lower())
    return _ENTITY_SYNONYMS.get(word) or _ENTITY_SYNONYMS.get(word.rstrip("s"))


def map_relationship_type(raw: str) -> tuple[str, bool]:
    """Whitelisted relationship type and whether it had to fall back to RELATED_TO."""
    norm = re.sub(r"[^A-Z_]", "", re.sub(r"[\s-]+", "_", raw.strip().upper()))
    if norm in RELATIONSHIP_TYPES:
        return norm, False
    if norm in _REL_SYNONYMS:
        return _REL_SYNONYMS[norm], False
    return FALLBACK_RELATIONSHIP, True


class ExtractedEntity(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    type: str
    description: str = ""


class ExtractedRelationship(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str
    target: str
    type: str
    description: str = ""


class Extraction(BaseModel):
    """What the model must return for one chunk."""

    model_config = ConfigDict(extra="forbid")
    entities: list[ExtractedEntity] = []
    relationships: list[ExtractedRelationship] = []


def json_schema(max_entities: int, max_relationships: int, max_name: int = 80,
                max_description: int = 160) -> dict[str, Any]:
    """The response schema with bounds, so a grammar-constrained model cannot ramble."""
    def text(n: int) -> dict[str, Any]:
        return {"type": "string", "maxLength": n}

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
                    "properties": {
                        "name": text(max_name),
                        "type": {"type": "string", "enum": list(ENTITY_TYPES)},
                        "description": text(max_description),
                    },
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
                        "type": {"type": "string", "enum": list(RELATIONSHIP_TYPES)},
                        "description": text(max_description),
                    },
                },
            },
        },
    }


SYSTEM_PROMPT = (
    "You extract a knowledge graph from one document. Return JSON only.\n"
    "entities: the people, organizations, projects, topics, decisions, products, locations "
    "and events the text names, each with a type from: " + ", ".join(ENTITY_TYPES) + ", and a "
    "short description.\n"
    "relationships: links between those entities (source and target are entity names), with a "
    "type from: " + ", ".join(RELATIONSHIP_TYPES) + ".\n"
    "Use names exactly as written. Do not invent facts."
)
