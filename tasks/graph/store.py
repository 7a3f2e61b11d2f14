"""The graph-store protocol and the upsert logic both backends share.

A backend supplies `_write(query, params)` (one transaction) and `_read(query, params)`;
everything else — batching, ordering, retraction — lives here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from tasks.graph import queries as q
from tasks.records import FailedDocument

T = TypeVar("T")


def batched(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class EntityRow:
    """One entity as the batch upserts it: merged by `key` (the resolver's "Type:name"),
    across the batch's documents (`merge`) and then into the graph node of that key."""

    key: str
    type: str
    name: str
    aliases: list[str] = field(default_factory=list)
    description: str = ""
    affiliation: str | None = None
    emails: list[str] = field(default_factory=list)
    phones: list[str] = field(default_factory=list)
    # the graph schema's optional properties of this type ({"role": "chair"}); names were
    # checked as identifiers when the schema was read (tasks/ontology.py)
    properties: dict[str, str] = field(default_factory=dict)

    def merge(self, other: EntityRow) -> None:
        for attr in ("aliases", "emails", "phones"):
            mine = getattr(self, attr)
            mine.extend(x for x in getattr(other, attr) if x not in mine)
        if len(other.description) > len(self.description):
            self.description = other.description
        self.affiliation = self.affiliation or other.affiliation
        for k, v in other.properties.items():
            self.properties.setdefault(k, v)


@dataclass
class RelRow:
    """One relationship between two entity keys, with the documents and chunks stating it."""

    src: str
    type: str
    dst: str
    doc_ids: list[str] = field(default_factory=list)
    description: str = ""
    chunks: list[str] = field(default_factory=list)  # ids ("doc#index") of supporting chunks


@dataclass
class ChunkRow:
    """One chunk of a document's text as sent to the LLM: what a fact's evidence points at.
    start/end are character offsets into Document.text, end exclusive."""

    id: str
    document: str
    index: int
    start: int
    end: int
    text: str

    def __post_init__(self) -> None:
        # retraction finds a document's chunk ids on relationships by this form
        if self.id != f"{self.document}#{self.index}":
            raise ValueError(f"chunk id {self.id!r} must be "
                             f"{self.document + '#' + str(self.index)!r} (document#index)")
        if not 0 <= self.start <= self.end or self.index < 0:
            raise ValueError(f"chunk {self.id!r}: index {self.index} and span "
                             f"[{self.start}, {self.end}) must be non-negative, start <= end")


@dataclass
class GraphBatch:
    """Everything one batch of documents contributes to the graph."""

    documents: list[dict[str, Any]] = field(default_factory=list)  # id, stream, path, hash, …
    entities: dict[str, EntityRow] = field(default_factory=dict)
    # (entity key, document id) → the chunk indexes naming it; empty for deterministic data
    # (front matter, contact records), which no chunk carries
    mentions: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    relationships: dict[tuple[str, str, str], RelRow] = field(default_factory=dict)
    chunks: dict[str, ChunkRow] = field(default_factory=dict)

    def add_chunk(self, row: ChunkRow) -> None:
        self.chunks[row.id] = row

    def add_entity(self, row: EntityRow, doc_id: str, chunk: int | None = None) -> None:
        if row.key in self.entities:
            self.entities[row.key].merge(row)
        else:
            self.entities[row.key] = row
        indexes = self.mentions.setdefault((row.key, doc_id), set())
        if chunk is not None:
            indexes.add(chunk)

    def add_relationship(self, row: RelRow) -> None:
        k = (row.src, row.type, row.dst)
        if k in self.relationships:
            existing = self.relationships[k]
            existing.doc_ids.extend(d for d in row.doc_ids if d not in existing.doc_ids)
            existing.chunks.extend(c for c in row.chunks if c not in existing.chunks)
            if len(row.description) > len(existing.description):
                existing.description = row.description
        else:
            self.relationships[k] = row


class GraphStore(ABC):
    """A property graph holding Documents, Entities and their relationships."""

    dialect: q.Dialect = "neo4j"
    location: str = ""  # where the graph lives, for people

    def __init__(self, batch_size: int = 1000) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.batch_size = batch_size

    @abstractmethod
    def _write(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run one statement in its own write transaction; return rows as dicts."""

    @abstractmethod
    def _read(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run one read-only statement."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def _schema_statement_done(self, error: Exception) -> bool:
        """True when a schema statement failed only because it was already applied."""

    def __enter__(self) -> GraphStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ensure_schema(self) -> None:
        for stmt in q.SCHEMA[self.dialect]:
            try:
                self._write(stmt)
            except Exception as e:  # noqa: BLE001 - dialect decides which errors mean "done"
                if not self._schema_statement_done(e):
                    raise

    def _write_batched(self, query: str, rows: list[Any], **params: Any) -> None:
        for chunk in batched(rows, self.batch_size):
            self._write(query, {"rows": list(chunk), **params})

    def document_states(self) -> dict[str, dict[str, Any]]:
        return {r["id"]: r for r in self._read(q.DOCUMENT_STATES)}

    def keys_by_email(self, emails: Iterable[str]) -> dict[str, str]:
        emails = sorted(set(emails))
        if not emails:
            return {}
        return {r["email"]: r["key"] for r in self._read(q.KEYS_BY_EMAIL, {"emails": emails})}

    def retract(self, doc_ids: Sequence[str], delete: bool = False) -> None:
        """Remove what these documents contributed: provenance on relationships (doc ids
        and chunk ids; deleting relationships left unsupported), mentions, chunks, and the
        extraction mark (or the Document node itself when `delete`). Entities left
        unmentioned are pruned separately."""
        steps = [q.RETRACT_REL_PROVENANCE, q.DELETE_UNSUPPORTED_RELS, q.DELETE_MENTIONS,
                 q.DELETE_CHUNKS, q.DELETE_DOCUMENTS if delete else q.UNMARK_DOCUMENTS]
        for chunk in batched(list(doc_ids), self.batch_size):
            for stmt in steps:
                self._write(stmt, {"ids": list(chunk)})

    def upsert(self, batch: GraphBatch) -> None:
        """Idempotent: running the same batch twice leaves the same graph."""
        now = now_iso()
        docs = [{k: d[k] for k in ("id", "stream", "path")} for d in batch.documents]
        self._write_batched(q.UPSERT_DOCUMENTS, docs)
        self._write_batched(q.UPSERT_CHUNKS, [c.__dict__ for c in batch.chunks.values()])
        by_label: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in batch.entities.values():
            by_label[e.type].append(e.__dict__)
        for label in sorted(by_label):
            self._write_batched(q.upsert_entities(label), by_label[label], now=now)
        mentions = [{"key": k, "doc": d, "chunks": sorted(batch.mentions[k, d])}
                    for k, d in sorted(batch.mentions)]
        self._write_batched(q.UPSERT_MENTIONS, mentions)
        by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in batch.relationships.values():
            by_type[r.type].append({"src": r.src, "dst": r.dst, "doc_ids": r.doc_ids,
                                    "chunks": r.chunks, "description": r.description})
        for rel in sorted(by_type):
            self._write_batched(q.upsert_relationships(rel), by_type[rel], now=now)

    def mark_extracted(self, documents: list[dict[str, Any]]) -> None:
        rows = [{k: d[k] for k in ("id", "hash", "model", "prompt_version", "extracted_at")}
                for d in documents]
        self._write_batched(q.MARK_DOCUMENTS, rows)

    def mark_failed(self, failures: list[FailedDocument]) -> None:
        rows = [f.model_dump(include={"id", "stream", "path", "hash", "model", "prompt_version",
                                      "message"}) for f in failures]
        self._write_batched(q.MARK_FAILED, rows)

    def prune_orphans(self) -> int:
        rows = self._write(q.PRUNE_ORPHANS)
        return int(rows[0]["pruned"]) if rows else 0

    def stats(self) -> dict[str, dict[str, int]]:
        nodes: dict[str, int] = defaultdict(int)
        for r in self._read(q.NODE_COUNTS):
            for label in r["labels"]:
                nodes[label] += int(r["n"])
        rels = {r["type"]: int(r["n"]) for r in self._read(q.REL_COUNTS)}
        return {"nodes": dict(sorted(nodes.items())), "relationships": dict(sorted(rels.items()))}

    def top_entities(self, limit: int = 10) -> list[dict[str, Any]]:
        return self._read(q.TOP_ENTITIES, {"limit": limit})

    def evidence(self, key: str) -> list[dict[str, Any]]:
        """The text behind an entity: each chunk that names it, as {document, path, chunk,
        start, end, text}, by document then chunk. Empty for deterministic data."""
        return self._read(q.ENTITY_EVIDENCE, {"key": key})

    def relationship_evidence(self, src: str, type: str, dst: str) -> list[dict[str, Any]]:
        """The text behind a relationship, as `evidence` gives it for an entity."""
        return self._read(q.relationship_evidence(type), {"src": src, "dst": dst})

    def clear(self) -> None:
        """Delete every node and relationship (for scratch graphs)."""
        self._write("MATCH (n) DETACH DELETE n")

    def query(self, cypher: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Read-only query for operators and notebooks."""
        return self._read(cypher, params)
