"""The graph-store protocol and the upsert logic both backends share.

A backend supplies `_write(query, params)` (one transaction) and `_read(query, params)`;
everything else — batching, ordering, retraction — lives here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from tasks.graph import queries as q
from tasks.records import FailedDocument
from tasks.shared.errors import GraphError

T = TypeVar("T")


DEFAULT_BATCH_BYTES = 8 << 20  # a transaction's parameters (Neo4jGraph.batch_bytes' default)
_SCALARS = (str, int, float, bool)


@dataclass(frozen=True)
class Restored:
    """What `restore_graph` did: where, the counts the graph now holds, and where the data it
    replaced is kept (None: there was none)."""

    where: str
    counts: dict[str, dict[str, int]]
    kept: Path | None


@dataclass(frozen=True)
class GraphServer:
    """The graph a check reads from, as it names it: `where` (never the password), the
    `secret` to keep out of its messages, the `fix` when it does not answer, whether an answer
    of "loading" means it is up (FalkorDB reading its data), and `connect` (None: the embedded
    FalkorDB, phase 1's to start)."""

    where: str
    secret: str = ""
    fix: str = ""
    loads_data: bool = False
    connect: Callable[[], GraphStore] | None = None


def batched(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def value_bytes(value: Any) -> int:
    """About what a parameter value weighs on the wire and in the server's transaction: UTF-8
    for text, 8 bytes a number, the sum for lists and maps."""
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, dict):
        return sum(len(k) + value_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(value_bytes(v) for v in value) + 8
    return 8


def sized_batches(rows: Sequence[T], size: int, max_bytes: int,
                  weigh: Callable[[T], int] = value_bytes) -> Iterator[Sequence[T]]:
    """Runs of at most `size` rows and, unless one row alone is larger, `max_bytes`."""
    start, weight = 0, 0
    for i, row in enumerate(rows):
        w = weigh(row)
        if i > start and (i - start >= size or weight + w > max_bytes):
            yield rows[start:i]
            start, weight = i, 0
        weight += w
    if start < len(rows):
        yield rows[start:]


def _property_problem(value: Any) -> str | None:
    """Why Neo4j would refuse `value` as a property (None: it stores it). Neo4j stores a
    scalar, or a list of scalars of one type; not a map, not a null inside a list (Cypher
    manual, "Property values"). A null at the top level removes the property."""
    if value is None or isinstance(value, _SCALARS):
        return None
    if isinstance(value, dict):
        return "is a map (a property holds a value or a list, never a map)"
    if isinstance(value, list | tuple):
        kinds = set()
        for i, v in enumerate(value):
            if v is None:
                return f"holds a null at index {i} (a stored list has no nulls)"
            if not isinstance(v, _SCALARS):
                return f"holds a {type(v).__name__} at index {i} (a stored list holds scalars)"
            # bool, int, float, str. Neo4j 5.26 refuses [True, 1] and turns [1, 2.5] into
            # [1.0, 2.5] (measured): both are refused here, so no value changes its type.
            kinds.add(type(v))
        if len(kinds) > 1:
            return "mixes types (a stored list holds one type)"
        return None
    return f"is a {type(value).__name__} (a property holds text, a number or a boolean)"


def check_row(what: str, row: dict[str, Any], nested: tuple[str, ...] = ()) -> None:
    """Raise GraphError naming the row and the field that neither store could keep as it is:
    `nested` names the fields that are maps of properties set with `+=` (there a null would
    silently remove the property)."""
    for name, value in row.items():
        if name in nested and isinstance(value, dict):
            for key, v in value.items():
                why = "is null (SET += would drop the property)" if v is None else \
                    _property_problem(v)
                if why:
                    raise GraphError(f"{what}: field {name}.{key} {why} — fix the row's source "
                                     "(the extraction's output or its mapping)")
            continue
        why = _property_problem(value)
        if why:
            raise GraphError(f"{what}: field {name} {why} — fix the row's source (the "
                             "extraction's output or its mapping)")


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
    namesake_of: str | None = None  # a namesake's name key ("Person:john smith"): found by it
    # the graph schema's optional properties of this type ({"role": "chair"}); names were
    # checked as identifiers when the schema was read (tasks/graph/ontology.py)
    properties: dict[str, str] = field(default_factory=dict)

    def merge(self, other: EntityRow) -> None:
        for attr in ("aliases", "emails", "phones"):
            mine = getattr(self, attr)
            mine.extend(x for x in getattr(other, attr) if x not in mine)
        if len(other.description) > len(self.description):
            self.description = other.description
        self.affiliation = self.affiliation or other.affiliation
        self.namesake_of = self.namesake_of or other.namesake_of
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
    # (entity key, document id, the document's form of the name) → the evidence that joined
    # that form to the entity (q.UPSERT_JOINS)
    joins: dict[tuple[str, str, str], str] = field(default_factory=dict)

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

    location: str = ""  # where the graph lives, for people

    def __init__(self, batch_size: int = 1000, batch_bytes: int = DEFAULT_BATCH_BYTES) -> None:
        if batch_size < 1 or batch_bytes < 1:
            raise ValueError("batch_size and batch_bytes must be at least 1")
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes

    @abstractmethod
    def _write(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run one statement in its own write transaction; return rows as dicts."""

    @abstractmethod
    def _read(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run one read-only statement."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def ensure_schema(self) -> None:
        """Create the key indexes or constraints (q.UNIQUE_KEYS) unless present; raise
        GraphError naming the fix when the server refuses."""

    def missing_keys(self) -> list[str] | None:
        """The keys of q.UNIQUE_KEYS no constraint holds now ("Label.property"), for the
        preflight to make before the night; None where the store makes them as it opens."""
        return None

    def __enter__(self) -> GraphStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_batched(self, query: str, rows: list[Any], *, checked: bool = False,
                       **params: Any) -> None:
        """Every row checked first (unless the caller has), then one transaction per
        batch_size rows or batch_bytes of them, whichever comes first."""
        if not checked:
            for row in rows:
                check_row(f"document {row.get('id')!r}", row)
        for chunk in sized_batches(rows, self.batch_size, self.batch_bytes):
            self._write(query, {"rows": list(chunk), **params})

    def _delete_chunks(self, doc_ids: list[str]) -> None:
        """The chunks of these documents, deleted batch_size or batch_bytes of text at a time."""
        sizes = self._read(q.CHUNK_SIZES, {"ids": doc_ids})
        for run in sized_batches(sizes, self.batch_size, self.batch_bytes,
                                 lambda r: int(r["bytes"] or 0) + 64):
            self._write(q.DELETE_CHUNKS, {"rows": [{"id": r["id"]} for r in run]})

    def _delete_all(self, query: str, **params: Any) -> int:
        """Repeat a bounded delete (q.PRUNE_ORPHANS, q.CLEAR) until it deletes nothing: at
        most batch_size nodes a transaction. The number deleted."""
        total = 0
        while True:
            rows = self._write(query, {**params, "limit": self.batch_size})
            n = int(rows[0]["deleted"]) if rows else 0
            total += n
            if n == 0:
                return total

    def read_together(self, queries: Sequence[str]) -> Iterator[tuple[int, dict[str, Any]]]:
        """(query index, row) for read-only queries run one after the other, as of one moment
        where the store can give one (Neo4j: one transaction)."""
        for i, query in enumerate(queries):
            for row in self._read(query):
                yield i, row

    def document_states(self) -> dict[str, dict[str, Any]]:
        return {r["id"]: r for r in self._read(q.DOCUMENT_STATES)}

    def keys_by_email(self, emails: Iterable[str], keys: Iterable[str] = ()) -> dict[str, str]:
        """E-mail address → Person key: the Persons that hold any of `emails`, and every
        address of the entities whose key is in `keys` (a name's Person, for its namesakes)."""
        emails, keys = sorted(set(emails)), sorted(set(keys))
        out = {r["email"]: r["key"] for r in self._read(q.EMAILS_OF_KEYS, {"keys": keys})} \
            if keys else {}
        if emails:
            out |= {r["email"]: r["key"] for r in self._read(q.KEYS_BY_EMAIL, {"emails": emails})}
        return out

    def phones_of_names(self, keys: Iterable[str]) -> list[tuple[str, str]]:
        """(phone as written, Person key) of the Persons of each name key ("Person:john
        smith"): the one of that key and its namesakes."""
        keys = sorted(set(keys))
        return [(r["phone"], r["key"]) for r in self._read(q.PHONES_OF_NAMES, {"keys": keys})] \
            if keys else []

    def colleagues(self, orgs: Iterable[str]) -> list[dict[str, Any]]:
        """The Persons who work for each organization key: {org, key, name}."""
        orgs = sorted(set(orgs))
        return self._read(q.COLLEAGUES, {"orgs": orgs}) if orgs else []

    def people_named(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        """For each name key ("Person:john smith"), the Persons a mention of that name alone
        could be — the one of that key and its namesakes — each {name, key, emails, phones,
        employers} (the keys of the organizations it WORKS_FOR)."""
        keys = sorted(set(keys))
        return self._read(q.PEOPLE_NAMED, {"keys": keys}) if keys else []

    def merges(self, key: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """The joins (GraphBatch.joins), newest first: {at, key, name, form, evidence,
        document}; of one entity when `key` is given."""
        return self._read(q.MERGES, {"key": key, "limit": limit})

    def splits(self) -> dict[str, set[str]]:
        """Entity key → the forms `split` keeps apart from it (lower case)."""
        out: dict[str, set[str]] = defaultdict(set)
        for r in self._read(q.SPLITS):
            out[r["key"]].add(r["form"])
        return dict(out)

    def split(self, key: str, forms: Sequence[str]) -> list[str]:
        """Undo the joins of `forms` (any case) into the entity `key`: from now on no evidence
        joins them to it (q.ADD_SPLIT), its aliases lose them, and the documents that joined
        them are retracted and unmarked, so the next run extracts them again without the
        join. The documents, sorted; GraphError naming the entity's joins when a form has
        none (a form split before is no error: its documents were retracted then)."""
        wanted = {f.strip().lower() for f in forms if f.strip()}
        joined = self.merges(key, limit=1_000_000)
        docs = sorted({j["document"] for j in joined if j["form"].lower() in wanted})
        done = self.splits().get(key, set())
        missing = sorted(wanted - {j["form"].lower() for j in joined} - done)
        if not wanted or missing:
            forms_of = sorted({j["form"] for j in joined})
            raise GraphError(f"graph split {key!r}: no join of {missing or list(forms)} to it "
                             f"— its joined forms are {forms_of or 'none'} (`slm-nightly graph "
                             "merges` lists every join with its entity's key)")
        self._write(q.ADD_SPLIT, {"key": key, "forms": sorted(wanted), "now": now_iso()})
        self.retract(docs)
        return docs

    def retract(self, doc_ids: Sequence[str], delete: bool = False) -> None:
        """Remove what these documents contributed: provenance on relationships (doc ids
        and chunk ids; deleting relationships left unsupported), mentions, chunks, and the
        extraction mark (or the Document node itself when `delete`). Entities left
        unmentioned are pruned separately."""
        for chunk in batched(list(doc_ids), self.batch_size):
            ids = list(chunk)
            for stmt in (q.RETRACT_REL_PROVENANCE, q.DELETE_UNSUPPORTED_RELS, q.DELETE_MENTIONS,
                         q.DELETE_JOINS):
                self._write(stmt, {"ids": ids})
            self._delete_chunks(ids)
            self._write(q.DELETE_DOCUMENTS if delete else q.UNMARK_DOCUMENTS, {"ids": ids})

    def upsert(self, batch: GraphBatch) -> None:
        """Idempotent: running the same batch twice leaves the same graph. Every row is
        checked before the first statement runs (check_row), so a row neither store can keep
        fails the batch before any of it is written."""
        now = now_iso()
        docs = [{k: d[k] for k in ("id", "stream", "path")} for d in batch.documents]
        chunks = [c.__dict__ for c in batch.chunks.values()]
        by_label: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in batch.entities.values():
            by_label[e.type].append(e.__dict__)
        mentions = [{"key": k, "doc": d, "chunks": sorted(batch.mentions[k, d])}
                    for k, d in sorted(batch.mentions)]
        joins = [{"key": k, "doc": d, "form": f, "evidence": e}
                 for (k, d, f), e in sorted(batch.joins.items())]
        by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in batch.relationships.values():
            by_type[r.type].append({"src": r.src, "dst": r.dst, "doc_ids": r.doc_ids,
                                    "chunks": r.chunks, "description": r.description})
        for d in docs:
            check_row(f"document {d['id']!r}", d)
        for c in chunks:
            check_row(f"chunk {c['id']!r}", c)
        for ent in (ent for rows in by_label.values() for ent in rows):
            check_row(f"entity {ent['key']!r}", ent, ("properties",))
        for m in mentions:
            check_row(f"mention of {m['key']!r} in {m['doc']!r}", m)
        for j in joins:
            check_row(f"join of {j['form']!r} to {j['key']!r} in {j['doc']!r}", j)
        for rel, rows in by_type.items():
            for row in rows:
                check_row(f"relationship {row['src']!r} {rel} {row['dst']!r}", row)
        self._write_batched(q.UPSERT_DOCUMENTS, docs, checked=True)
        self._write_batched(q.UPSERT_CHUNKS, chunks, checked=True)
        for label in sorted(by_label):
            self._write_batched(q.upsert_entities(label), by_label[label], checked=True,
                               now=now)
        self._write_batched(q.UPSERT_MENTIONS, mentions, checked=True)
        self._write_batched(q.UPSERT_JOINS, joins, checked=True, now=now)
        for rel in sorted(by_type):
            self._write_batched(q.upsert_relationships(rel), by_type[rel], checked=True,
                               now=now)

    def mark_extracted(self, documents: list[dict[str, Any]]) -> None:
        rows = [{k: d[k] for k in ("id", "hash", "model", "prompt_version", "extracted_at")}
                for d in documents]
        self._write_batched(q.MARK_DOCUMENTS, rows)

    def mark_failed(self, failures: list[FailedDocument]) -> None:
        rows = [f.model_dump(include={"id", "stream", "path", "hash", "model", "prompt_version",
                                      "message"}) for f in failures]
        self._write_batched(q.MARK_FAILED, rows)

    def prune_orphans(self) -> int:
        return self._delete_all(q.PRUNE_ORPHANS)

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
        """Delete every node and relationship (for scratch graphs): the chunks by size first,
        then the rest batch_size nodes at a time."""
        self._delete_chunks([r["id"] for r in self._read("MATCH (d:Document) RETURN d.id AS id")])
        self._delete_all(q.CLEAR)

    def query(self, cypher: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Read-only query for operators and notebooks."""
        return self._read(cypher, params)
