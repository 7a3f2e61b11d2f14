"""The graph's schema as configuration: node types, relationship types, allowed patterns.

A TOML file (schemas/graph.toml ships; the profile's [extraction] schema names another) is
read once into a GraphSchema. Everything phase 1 asks for and keeps comes from it: the
request's JSON schema (tasks/extraction/schema.py), the system prompt
(tasks/extraction/prompt.py), the mapping of a model's labels onto the schema's, and the
pruning of relationships no pattern allows. Its digest, with the prompt's, is the extraction
version documents are marked with, so an edit re-extracts what it affects without a hand-bumped
version. A leaf module: it imports nothing of the project but its errors and the digest helper.

Labels become Cypher labels, so they are checked as identifiers here (and again, by the same
`checked_name`, in tasks/graph/queries.py before any statement is formatted).
"""

from __future__ import annotations

import functools
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tasks.shared.errors import ConfigError
from tasks.shared.files import sha256_hex

DEFAULT_SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "graph.toml"
WILDCARD = "*"
# The graph's own labels and relationship types (tasks/graph/queries.py): never a schema's.
RESERVED_LABELS = frozenset({"Entity", "Document", "Chunk", "Split"})
RESERVED_TYPES = frozenset({"MENTIONED_IN", "CHUNK_OF", "JOINED"})
# An entity's own fields (tasks/graph/store.py EntityRow): no schema property may shadow one.
RESERVED_PROPERTIES = frozenset({"key", "type", "name", "aliases", "description", "affiliation",
                                 "emails", "phones", "first_seen", "last_seen", "properties"})
# fullmatch, not ^…$: "$" also matches before a trailing newline.
LABEL_PATTERN = re.compile(r"[A-Z][A-Za-z0-9_]{0,63}")
TYPE_PATTERN = re.compile(r"[A-Z][A-Z0-9_]{0,63}")

NameKind = Literal["label", "type"]  # a node label, a relationship type
NAME_RULES: dict[NameKind, tuple[re.Pattern[str], frozenset[str]]] = {
    "label": (LABEL_PATTERN, RESERVED_LABELS), "type": (TYPE_PATTERN, RESERVED_TYPES)}
# What a schema file is told: (not an identifier, one of the graph's own).
_SCHEMA_NAME_ERRORS: dict[NameKind, tuple[str, str]] = {
    "label": ("node label {name!r} must be an identifier starting with a capital (e.g. 'Person')",
              "node label {name!r} is the graph's own — choose another name"),
    "type": ("relationship type {name!r} must be upper case with underscores (e.g. 'WORKS_FOR')",
             "relationship type {name!r} is the graph's own — choose another name")}


def checked_name(value: object, kind: NameKind, malformed: str, taken: str) -> str:
    """`value` when it is a string the kind's pattern matches whole and not one of its reserved
    names; else a ValueError: `malformed` or `taken`, formatted with the value as {name!r} and
    the reserved names as {reserved}."""
    pattern, reserved = NAME_RULES[kind]
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(malformed.format(name=value, reserved=", ".join(sorted(reserved))))
    if value in reserved:
        raise ValueError(taken.format(name=value, reserved=", ".join(sorted(reserved))))
    return value


def _schema_name(kind: NameKind) -> AfterValidator:
    return AfterValidator(lambda v: checked_name(v, kind, *_SCHEMA_NAME_ERRORS[kind]))


Pruning = Literal["kept", "reversed", "fallback", "dropped"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PropertySpec(_Strict):
    name: str
    description: str = ""

    @field_validator("name")
    @classmethod
    def _identifier(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", v):
            raise ValueError(f"property {v!r} must be a lower-case identifier (e.g. 'role')")
        if v in RESERVED_PROPERTIES:
            raise ValueError(f"property {v!r} is an entity's own field — choose another name")
        return v


class NodeType(_Strict):
    label: Annotated[str, _schema_name("label")]
    description: str
    properties: tuple[PropertySpec, ...] = ()
    synonyms: tuple[str, ...] = ()  # model-written labels that mean this one (any case)
    # names of this type must occur in their chunk's text: one that does not (invented, copied
    # from the prompt's example, a reasoning fragment) is dropped and counted. Descriptive
    # types (a decision, a topic) are named in the model's words, so they only count.
    require_grounding: bool = False


class RelationshipType(_Strict):
    type: Annotated[str, _schema_name("type")]
    description: str
    synonyms: tuple[str, ...] = ()


class ExampleEntity(_Strict):
    name: str
    type: str
    description: str = ""


class ExampleRelationship(_Strict):
    source: str
    type: str
    target: str
    description: str = ""


class Example(_Strict):
    text: str
    entities: tuple[ExampleEntity, ...] = ()
    relationships: tuple[ExampleRelationship, ...] = ()


class _SchemaFile(_Strict):
    unknown_patterns: Literal["drop", "fallback"] = "drop"
    fallback_relationship: str = "RELATED_TO"
    node: tuple[NodeType, ...] = Field(min_length=1)
    relationship: tuple[RelationshipType, ...] = Field(min_length=1)
    patterns: tuple[tuple[str, str, str], ...] = Field(min_length=1)
    example: tuple[Example, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> _SchemaFile:
        labels = [n.label for n in self.node]
        types = [r.type for r in self.relationship]
        for what, names in (("node label", labels), ("relationship type", types)):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{what} {dupes[0]!r} is declared twice")
        if self.fallback_relationship not in types:
            raise ValueError(f"fallback_relationship {self.fallback_relationship!r} is not a "
                             f"declared relationship type ({', '.join(types)})")
        for i, (src, rel, dst) in enumerate(self.patterns):
            for end in (src, dst):
                if end != WILDCARD and end not in labels:
                    raise ValueError(f"patterns[{i}] {[src, rel, dst]}: {end!r} is not a node "
                                     f"label ({', '.join(labels)}, or '*')")
            if rel not in types:
                raise ValueError(f"patterns[{i}] {[src, rel, dst]}: {rel!r} is not a "
                                 f"relationship type ({', '.join(types)})")
        return self


@dataclass(frozen=True)
class GraphSchema:
    """One loaded schema file; hashable, so functions of it can be cached."""

    nodes: tuple[NodeType, ...]
    relationships: tuple[RelationshipType, ...]
    patterns: frozenset[tuple[str, str, str]]
    unknown_patterns: Literal["drop", "fallback"]
    fallback: str
    examples: tuple[Example, ...]
    path: str
    _digest: str

    @property
    def entity_types(self) -> tuple[str, ...]:
        return tuple(n.label for n in self.nodes)

    @property
    def relationship_types(self) -> tuple[str, ...]:
        return tuple(r.type for r in self.relationships)

    def digest(self) -> str:
        """sha256 (16 hex) of the schema's meaning: the same whatever the file's comments,
        layout or order of keys."""
        return self._digest

    def node(self, label: str) -> NodeType | None:
        return next((n for n in self.nodes if n.label == label), None)

    def property_names(self, label: str | None = None) -> tuple[str, ...]:
        """The optional properties of one node type, or of all (sorted, once each)."""
        nodes = [n for n in self.nodes if label is None or n.label == label]
        return tuple(sorted({p.name for n in nodes for p in n.properties}))

    def requires_grounding(self, label: str) -> bool:
        node = self.node(label)
        return bool(node and node.require_grounding)

    def map_entity_type(self, raw: str) -> str | None:
        """The schema's label for a model-written type ("companies", "org"), or None."""
        return _entity_synonyms(self).get(raw) or _plural_lookup(_entity_synonyms(self), raw)

    def map_relationship_type(self, raw: str) -> tuple[str, bool]:
        """The schema's type for a model-written one, and whether it fell back."""
        norm = re.sub(r"[^A-Z_]", "", re.sub(r"[\s-]+", "_", raw.strip().upper()))
        found = _relationship_synonyms(self).get(norm)
        return (found, False) if found else (self.fallback, True)

    def allows(self, src: str, rel: str, dst: str) -> bool:
        return any(p in self.patterns for p in ((src, rel, dst), (WILDCARD, rel, dst),
                                                (src, rel, WILDCARD), (WILDCARD, rel, WILDCARD)))

    def prune(self, src: str, rel: str, dst: str) -> tuple[Pruning, str]:
        """What to do with a relationship between entities of these types: keep it, turn it
        around (the reverse is allowed), keep it as the fallback type, or drop it; and the
        type to write."""
        if self.allows(src, rel, dst):
            return "kept", rel
        if self.allows(dst, rel, src):
            return "reversed", rel
        if self.unknown_patterns == "fallback" and self.allows(src, self.fallback, dst):
            return "fallback", self.fallback
        return "dropped", rel


@functools.cache
def _entity_synonyms(schema: GraphSchema) -> dict[str, str]:
    out: dict[str, str] = {}
    for n in schema.nodes:
        out[n.label] = n.label
        for word in (n.label, *n.synonyms):
            out.setdefault(_word(word), n.label)
    return out


@functools.cache
def _relationship_synonyms(schema: GraphSchema) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in schema.relationships:
        out[r.type] = r.type
        for word in r.synonyms:
            out.setdefault(re.sub(r"[^A-Z_]", "", word.upper()), r.type)
    return out


def _word(raw: str) -> str:
    return re.sub(r"[^a-z]", "", raw.lower())


def _plural_lookup(table: dict[str, str], raw: str) -> str | None:
    # English plurals: companies → company, places → place (one suffix only: "ss" is no plural)
    word = _word(raw)
    singulars = [word]
    if word.endswith("ies"):
        singulars.append(word[:-3] + "y")
    if word.endswith("s"):
        singulars.append(word[:-1])
    return next((table[w] for w in singulars if w in table), None)


def _explain(path: Path, e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        where = ".".join(str(x) for x in err["loc"]) or "(file)"
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {msg}")
    return (f"graph schema {path}: invalid —\n" + "\n".join(lines) +
            f"\nfix the file (the shipped one is {DEFAULT_SCHEMA}), or point the profile's "
            "[extraction] schema at another")


def _canonical(spec: _SchemaFile) -> str:
    data = spec.model_dump(mode="json")
    data["patterns"] = sorted(data["patterns"])
    return json.dumps(data, sort_keys=True, ensure_ascii=False)


def parse_schema(data: dict[str, Any], path: Path) -> GraphSchema:
    try:
        spec = _SchemaFile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_explain(path, e)) from None
    schema = GraphSchema(nodes=spec.node, relationships=spec.relationship,
                         patterns=frozenset(spec.patterns),
                         unknown_patterns=spec.unknown_patterns,
                         fallback=spec.fallback_relationship, examples=spec.example,
                         path=str(path),
                         _digest=sha256_hex(_canonical(spec), 16))
    for i, ex in enumerate(schema.examples):
        _check_example(schema, ex, f"example[{i}]", path)
    return schema


def _check_example(schema: GraphSchema, ex: Example, where: str, path: Path) -> None:
    """An example the prompt shows must keep the rules it teaches."""
    types = {e.name: e.type for e in ex.entities}
    fail = f"graph schema {path}: {where}"
    for e in ex.entities:
        if e.type not in schema.entity_types:
            raise ConfigError(f"{fail}: entity {e.name!r} has type {e.type!r}, not a node label")
    for r in ex.relationships:
        if r.source not in types or r.target not in types:
            raise ConfigError(f"{fail}: relationship {r.source!r} → {r.target!r} names an "
                              "entity the example does not list")
        if schema.prune(types[r.source], r.type, types[r.target])[0] != "kept":
            raise ConfigError(f"{fail}: {types[r.source]} {r.type} {types[r.target]} is not "
                              "an allowed pattern — fix the example or add the pattern")


def load_schema(path: str | Path) -> GraphSchema:
    """The schema in `path` (a TOML file); ConfigError naming the file and the fix. Read
    again when the file changes (a run, a notebook or a test may edit it between calls)."""
    p = Path(path).resolve()
    try:
        st = p.stat()
    except OSError:
        st = None
    return _load(p, st.st_mtime_ns if st else 0, st.st_size if st else -1)


@functools.lru_cache(maxsize=32)
def _load(p: Path, mtime_ns: int, size: int) -> GraphSchema:
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"graph schema {p}: no such file — fix [extraction] schema in the "
                          f"profile (the shipped schema is {DEFAULT_SCHEMA})") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"graph schema {p}: cannot be read ({e}) — fix the file") from None
    return parse_schema(data, p)


def default_schema() -> GraphSchema:
    return load_schema(DEFAULT_SCHEMA)
