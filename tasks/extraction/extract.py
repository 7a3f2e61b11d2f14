"""Phase-1 logic: plan what to extract, turn documents into graph rows, write them.

Deterministic parts (transcript participants, contact fields) never go to the LLM; free text
does, chunked to fit the endpoint's context. Everything here is plain Python; the Prefect
tasks in tasks/extraction/stages.py call it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.errors import ChunkTooLong, Deferred, GraphError, LLMError
from tasks.extraction.chunking import Chunk, chunks, estimate_tokens, halve
from tasks.extraction.documents import Document, LoadFailure
from tasks.extraction.llm import LLMClient, Usage
from tasks.extraction.prompt import (
    GLEAN_PROMPT,
    document_version,
    system_prompt,
    user_prompt,
)
from tasks.extraction.resolve import looks_like_person_name, normalize, resolve
from tasks.extraction.schema import Extraction
from tasks.graph.store import ChunkRow, EntityRow, GraphBatch, GraphStore, RelRow, now_iso
from tasks.ontology import GraphSchema, default_schema
from tasks.waiting import backoff_seconds

MAX_SPLIT_DEPTH = 2
GRAPH_ATTEMPTS = 3
GRAPH_RETRY_SECONDS = 1.0
GRAPH_RETRY_CAP_SECONDS = GRAPH_RETRY_SECONDS * 2 ** (GRAPH_ATTEMPTS - 2)  # the old longest wait
UNGROUNDED_SAMPLES = 20  # names listed in the report (the count is whole)


@dataclass
class Plan:
    extract: list[Document]
    skipped: list[Document]
    changed: list[str]  # ids already in the graph whose content (or model/prompt) changed
    deleted: list[str]  # ids in the graph whose file is gone
    held: list[tuple[Document, str]] = field(default_factory=list)  # failed before, unchanged
    # why the documents already in the graph are extracted again: "content", "model",
    # "extraction version" (the schema, the prompt or gleanings changed), "retry", "full"
    reasons: Counter[str] = field(default_factory=Counter)


def _why(st: dict[str, Any], d: Document, model: str, version: str) -> str:
    if st.get("hash") not in (None, d.hash) or st.get("failed_hash") not in (None, d.hash):
        return "content"
    if st.get("model", st.get("failed_model")) not in (None, model):
        return "model"
    if st.get("prompt_version", st.get("failed_prompt_version")) not in (None, version):
        return "extraction version"
    return "retry"


def plan(docs: list[Document], failures: list[LoadFailure], states: dict[str, dict[str, Any]],
         streams: Iterable[str], model: str, full: bool = False,
         retry_failed: bool = False, ontology: GraphSchema | None = None,
         gleanings: int = 0) -> Plan:
    """Decide per document: skip (unchanged since its last successful extraction), hold
    (unchanged since it failed), extract, or retract (deleted). A file that now fails to load
    keeps its old graph contribution. "Unchanged" is the same content, model and extraction
    version (tasks/extraction/prompt.py: the schema's and the prompt's digests)."""
    out = Plan([], [], [], [])
    ontology = ontology or default_schema()
    for d in docs:
        st = states.get(d.id) or {}
        version = document_version(d, ontology, gleanings)
        key = (d.hash, model, version)
        fresh = (st.get("hash"), st.get("model"), st.get("prompt_version")) == key
        failed = (st.get("failed_hash"), st.get("failed_model"),
                  st.get("failed_prompt_version")) == key
        if fresh and not full:
            out.skipped.append(d)
        elif failed and not (full or retry_failed):
            out.held.append((d, str(st.get("failed_reason"))))
        else:
            out.extract.append(d)
            if st:
                out.changed.append(d.id)
                out.reasons["full" if full and (fresh or failed) else
                            "retry" if failed else _why(st, d, model, version)] += 1
    present = {d.id for d in docs} | {f.id for f in failures}
    streams = set(streams)
    out.deleted = sorted(i for i, st in states.items()
                         if i not in present and st.get("stream") in streams)
    return out


@dataclass
class ChunkAnswer:
    """One chunk and what the model answered for it (halves and gleanings included)."""

    chunk: Chunk
    answers: list[Extraction] = field(default_factory=list)


@dataclass
class DocOutcome:
    doc: Document
    chunks: list[ChunkAnswer] = field(default_factory=list)
    error: str | None = None
    error_type: str | None = None
    attempts: int = 0
    endpoint_down: bool = False  # failed because the endpoint was unreachable: not held
    unanswered: bool = False  # no attempt got an answer (timeouts, server down): not held
    # the deadline could not cover one of its requests: neither extracted nor failed, it
    # waits for the next run (what its other chunks returned is dropped)
    deferred: bool = False
    gleaning_failures: int = 0  # gleaning passes that got no usable answer (first kept)

    @property
    def extraction(self) -> list[Extraction]:
        return [a for c in self.chunks for a in c.answers]


@dataclass
class BatchReport:
    extracted: Counter[str] = field(default_factory=Counter)  # per stream
    failed: list[dict[str, Any]] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)  # ids: not marked, not dead-lettered
    usage: Usage = field(default_factory=Usage)
    entities: int = 0
    relationships: int = 0
    rejected_entity_types: Counter[str] = field(default_factory=Counter)
    remapped_relationship_types: Counter[str] = field(default_factory=Counter)
    dropped_fields: Counter[str] = field(default_factory=Counter)  # unknown fields, by name
    dangling_relationships: int = 0
    # relationships no pattern allows, by "Source TYPE Target" as written: dropped; and the
    # ones turned around because the reverse is allowed
    pruned_relationships: Counter[str] = field(default_factory=Counter)
    reversed_relationships: Counter[str] = field(default_factory=Counter)
    # names the model wrote that occur (or not) in their chunk's text: grounded precision
    grounded_names: int = 0
    ungrounded_names: int = 0
    ungrounded: list[str] = field(default_factory=list)  # the first UNGROUNDED_SAMPLES
    aliases_resolved: int = 0  # "Mr. Viersen" → the document's one "Arnold Viersen"
    # ungrounded names of a type that requires grounding, dropped, by type
    dropped_ungrounded: Counter[str] = field(default_factory=Counter)
    gleaning_failures: int = 0
    write_seconds: float = 0.0  # the graph writes' time (phase 1 keeps it back from its budget)

    def add(self, other: BatchReport) -> None:
        """Fold in another batch's report: the run's totals are one BatchReport."""
        self.extracted.update(other.extracted)
        self.failed.extend(other.failed)
        self.deferred.extend(other.deferred)
        self.usage.add(other.usage)
        self.entities += other.entities
        self.relationships += other.relationships
        self.add_labels(other)

    def add_labels(self, other: BatchReport) -> None:
        """Take over the answer-quality counts of `other` (one write attempt's)."""
        for name in ("rejected_entity_types", "remapped_relationship_types", "dropped_fields",
                     "pruned_relationships", "reversed_relationships", "dropped_ungrounded"):
            getattr(self, name).update(getattr(other, name))
        for name in ("dangling_relationships", "grounded_names", "ungrounded_names",
                     "aliases_resolved", "gleaning_failures"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.ungrounded.extend(other.ungrounded[:UNGROUNDED_SAMPLES - len(self.ungrounded)])


def _answer_json(ex: Extraction) -> str:
    return json.dumps({"entities": [e.model_dump() for e in ex.entities],
                       "relationships": [r.model_dump() for r in ex.relationships]},
                      ensure_ascii=False)


async def _extract_chunk(client: LLMClient, doc: Document, chunk: str, schema: dict[str, Any],
                         depth: int, part: int, parts: int, ontology: GraphSchema
                         ) -> list[Extraction]:
    system = system_prompt(ontology)
    try:
        return [await client.extract(system, user_prompt(doc, chunk, part, parts), schema,
                                     ontology=ontology)]
    except ChunkTooLong as e:
        halves = halve(chunk)
        if depth >= MAX_SPLIT_DEPTH or len(halves) < 2:
            if "max_tokens" not in str(e):
                raise  # the prompt itself does not fit
            # Nothing left to split: the answer, not the chunk, is too long (greedy decoding
            # that loops) — other samples of the same chunk.
            return [await client.extract(system, user_prompt(doc, chunk, part, parts),
                                         schema, resample_cut=True, ontology=ontology)]
        results = await asyncio.gather(*(
            _extract_chunk(client, doc, h, schema, depth + 1, part, parts, ontology)
            for h in halves))
        return [x for r in results for x in r]


async def _glean(client: LLMClient, doc: Document, chunk: str, schema: dict[str, Any],
                 part: int, parts: int, ontology: GraphSchema, first: list[Extraction],
                 passes: int) -> tuple[list[Extraction], int]:
    """Ask `passes` times for what the answers so far missed (GraphRAG's gleaning). A pass
    that gets no usable answer ends gleaning for the chunk; what was found is kept."""
    if len(first) != 1:  # the chunk was halved: its answers are of other prompts
        return [], 0
    history: list[dict[str, str]] = []
    last = first[0]
    more: list[Extraction] = []
    for _ in range(passes):
        history += [{"role": "assistant", "content": _answer_json(last)},
                    {"role": "user", "content": GLEAN_PROMPT}]
        try:
            last = await client.extract(system_prompt(ontology),
                                        user_prompt(doc, chunk, part, parts), schema,
                                        history=list(history), ontology=ontology)
        except (LLMError, ChunkTooLong, Deferred):
            return more, 1
        if not last.entities and not last.relationships:
            break  # nothing missed: no further pass
        more.append(last)
    return more, 0


async def extract_document(client: LLMClient, doc: Document, chunk_tokens: int,
                           overlap_tokens: int, schema: dict[str, Any],
                           ontology: GraphSchema | None = None, gleanings: int = 0
                           ) -> DocOutcome:
    """Run the document's free text through the LLM, chunk by chunk (concurrently), each
    chunk gleaned `gleanings` times. Every chunk ends before the outcome is decided (no
    request outlives its document): a failed chunk fails the document, else a deferred one
    defers it."""
    ontology = ontology or default_schema()
    outcome = DocOutcome(doc)
    if not doc.text.strip():
        return outcome
    parts = chunks(doc.text, chunk_tokens, overlap_tokens)

    async def one(c: Chunk) -> tuple[list[Extraction], int]:
        got = await _extract_chunk(client, doc, c.text, schema, 0, c.index + 1, len(parts),
                                   ontology)
        if gleanings:
            more, failed = await _glean(client, doc, c.text, schema, c.index + 1, len(parts),
                                        ontology, got, gleanings)
            return got + more, failed
        return got, 0

    results = await asyncio.gather(*(one(c) for c in parts), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, LLMError | Deferred):
            raise r
    errors = [r for r in results if isinstance(r, LLMError)]
    if errors:
        e = errors[0]
        outcome.error, outcome.error_type, outcome.attempts = str(e), type(e).__name__, e.attempts
        outcome.endpoint_down = e.endpoint_down
        outcome.unanswered = all(x.unanswered for x in errors)
    elif any(isinstance(r, Deferred) for r in results):
        outcome.deferred = True
    else:
        for c, r in zip(parts, results, strict=True):
            answers, failed = r  # type: ignore[misc]
            outcome.chunks.append(ChunkAnswer(c, answers))
            outcome.gleaning_failures += failed
    return outcome


async def extract_documents(client: LLMClient, docs: list[Document], chunk_tokens: int,
                            overlap_tokens: int, schema: dict[str, Any],
                            on_done: Callable[[DocOutcome], None] | None = None, *,
                            ontology: GraphSchema | None = None, gleanings: int = 0
                            ) -> list[DocOutcome]:
    async def one(d: Document) -> DocOutcome:
        outcome = await extract_document(client, d, chunk_tokens, overlap_tokens, schema,
                                         ontology, gleanings)
        if on_done:
            on_done(outcome)
        return outcome

    async with client:
        return list(await asyncio.gather(*(one(d) for d in docs)))


def _entity(entity_type: str, raw: str, description: str = "") -> EntityRow:
    key, r = resolve(entity_type, raw)
    aliases = [raw.strip()] if raw.strip() != r.name else []
    return EntityRow(key=key, type=entity_type, name=r.name, aliases=aliases,
                     description=description.strip(), affiliation=r.affiliation)


_GROUND = re.compile(r"[\W_]+")


def _ground_form(s: str) -> str:
    return f" {_GROUND.sub(' ', normalize(s)).strip()} "


def grounded(name: str, text: str) -> bool:
    """The name occurs in the text as whole words (case, accents, punctuation and spacing
    aside): what grounded precision counts."""
    form = _ground_form(name)
    return form.strip() != "" and form in _ground_form(text)


@dataclass
class _DocRows:
    """What one document contributes, before aliases are resolved and it joins the batch."""

    doc: Document
    entities: list[tuple[EntityRow, int | None]] = field(default_factory=list)  # chunk index
    relationships: list[RelRow] = field(default_factory=list)

    def add(self, row: EntityRow, chunk: int | None = None) -> None:
        self.entities.append((row, chunk))


def _deterministic(doc: Document, rows: _DocRows, email_keys: dict[str, str],
                   ontology: GraphSchema, report: BatchReport) -> None:
    """Front matter and contact records: no model, the schema's labels where it has them."""
    def keep(src: str, rel: str, dst: str) -> bool:
        if ontology.node(src) and ontology.node(dst) and ontology.allows(src, rel, dst):
            return True
        report.pruned_relationships[f"{src} {rel} {dst}"] += 1
        return False

    if doc.stream == "transcripts" and ontology.node("Event"):
        meeting = _entity("Event", str(doc.metadata.get("title") or doc.id),
                          f"Meeting {doc.metadata.get('meeting_id', '')}".strip())
        rows.add(meeting)
        for raw in doc.metadata.get("participants", []):
            if not looks_like_person_name(raw) or not ontology.node("Person"):
                continue
            person = _entity("Person", raw)
            rows.add(person)
            if keep("Person", "PARTICIPATED_IN", "Event"):
                rows.relationships.append(RelRow(person.key, "PARTICIPATED_IN", meeting.key,
                                                 [doc.id]))
    elif doc.stream == "contacts" and ontology.node("Person"):
        for rec in doc.records:
            person = _entity("Person", rec["name"], rec.get("title") or "")
            # Contacts unify by e-mail: a known address wins over the spelling of the name.
            known = next((email_keys[e] for e in rec["emails"] if e in email_keys), None)
            if known and known != person.key:
                person.aliases = sorted({*person.aliases, person.name})
                person.key = known
            person.emails, person.phones = list(rec["emails"]), list(rec["phones"])
            for e in rec["emails"]:
                email_keys.setdefault(e, person.key)
            rows.add(person)
            if rec.get("organization") and ontology.node("Organization"):
                org = _entity("Organization", rec["organization"])
                rows.add(org)
                if keep("Person", "WORKS_FOR", "Organization"):
                    rows.relationships.append(RelRow(person.key, "WORKS_FOR", org.key,
                                                     [doc.id], rec.get("title") or ""))


def _from_llm(outcome: DocOutcome, rows: _DocRows, report: BatchReport,
              ontology: GraphSchema) -> None:
    doc = outcome.doc
    doc_names: dict[str, str] = {}  # a name of any chunk: relationships across chunks resolve
    pending: list[tuple[Any, int, dict[str, str]]] = []
    for ca in outcome.chunks:
        by_name: dict[str, str] = {}
        for ex in ca.answers:
            # labels were mapped (or their items dropped) and unknown fields dropped on the way
            report.rejected_entity_types.update(ex.repairs.rejected_entity_types)
            report.remapped_relationship_types.update(ex.repairs.remapped_relationship_types)
            report.dropped_fields.update(ex.repairs.dropped_fields)
            for ent in ex.entities:
                label = ontology.map_entity_type(ent.type)
                if label is None or not ent.name.strip():
                    report.rejected_entity_types[ent.type or "(empty)"] += 1
                    continue
                if grounded(ent.name, ca.chunk.text):
                    report.grounded_names += 1
                else:
                    report.ungrounded_names += 1
                    if len(report.ungrounded) < UNGROUNDED_SAMPLES:
                        report.ungrounded.append(f"{doc.id}#{ca.chunk.index}: {ent.name[:80]}")
                    if ontology.requires_grounding(label):
                        report.dropped_ungrounded[label] += 1
                        continue
                row = _entity(label, ent.name[:200], ent.description[:500])
                own = ontology.property_names(label)
                for k, v in ent.properties.items():
                    if k in own and v.strip():
                        row.properties[k] = v.strip()[:500]
                    elif k not in own:  # another type's property: not this entity's
                        report.dropped_fields[f"entities[].properties.{k}"] += 1
                rows.add(row, ca.chunk.index)
                for n in (ent.name.strip(), row.name):
                    by_name.setdefault(n.casefold(), row.key)
                    doc_names.setdefault(n.casefold(), row.key)
            pending += [(rel, ca.chunk.index, by_name) for rel in ex.relationships]
    for rel, index, by_name in pending:
        src, dst = (by_name.get(n.strip().casefold()) or doc_names.get(n.strip().casefold())
                    for n in (rel.source, rel.target))
        if not src or not dst or src == dst:
            report.dangling_relationships += 1
            continue
        rtype, remapped = ontology.map_relationship_type(rel.type)
        if remapped:
            report.remapped_relationship_types[rel.type] += 1
        s_type, d_type = src.split(":", 1)[0], dst.split(":", 1)[0]
        action, rtype = ontology.prune(s_type, rtype, d_type)
        written = f"{s_type} {rtype} {d_type}"
        if action == "dropped":
            report.pruned_relationships[written] += 1
            continue
        if action == "reversed":
            report.reversed_relationships[written] += 1
            src, dst = dst, src
        elif action == "fallback":
            report.remapped_relationship_types[written] += 1
        rows.relationships.append(RelRow(src, rtype, dst, [doc.id], rel.description[:500],
                                         chunks=[f"{doc.id}#{index}"]))


def _surname_aliases(rows: _DocRows) -> dict[str, str]:
    """Person keys of one word ("Mr. Viersen" → "Person:viersen") that match the last word of
    exactly one full name of the same document: key → that name's key. Only within a
    document: a surname alone never joins two documents' people."""
    persons = {row.key: row for row, _ in rows.entities if row.type == "Person"}
    full: dict[str, set[str]] = {}
    for key, row in persons.items():
        words = normalize(row.name).split()
        if len(words) >= 2:
            full.setdefault(words[-1], set()).add(key)
    out = {}
    for key, row in persons.items():
        words = normalize(row.name).split()
        if len(words) == 1 and len(full.get(words[0], ())) == 1:
            out[key] = next(iter(full[words[0]]))
    return out


def _join(rows: _DocRows, batch: GraphBatch, report: BatchReport) -> None:
    """The document's rows into the batch, each one-word alias under its full name."""
    aliases = _surname_aliases(rows)
    report.aliases_resolved += len(aliases)
    names = {row.key: row.name for row, _ in rows.entities}
    for row, index in rows.entities:
        if row.key in aliases:
            row = replace(row, key=aliases[row.key], name=names[aliases[row.key]],
                          aliases=list(dict.fromkeys([*row.aliases, row.name])))
        batch.add_entity(row, rows.doc.id, index)
    for rel in rows.relationships:
        src, dst = aliases.get(rel.src, rel.src), aliases.get(rel.dst, rel.dst)
        if src == dst:
            report.dangling_relationships += 1
            continue
        batch.add_relationship(replace(rel, src=src, dst=dst))


def build_batch(outcomes: list[DocOutcome], model: str, email_keys: dict[str, str],
                report: BatchReport, ontology: GraphSchema | None = None,
                gleanings: int = 0) -> GraphBatch:
    ontology = ontology or default_schema()
    batch = GraphBatch()
    now = now_iso()
    for o in outcomes:
        if o.error or o.deferred:
            continue
        d = o.doc
        batch.documents.append({"id": d.id, "stream": d.stream, "path": d.path, "hash": d.hash,
                                "model": model,
                                "prompt_version": document_version(d, ontology, gleanings),
                                "extracted_at": now})
        for ca in o.chunks:
            c = ca.chunk
            batch.add_chunk(ChunkRow(id=f"{d.id}#{c.index}", document=d.id, index=c.index,
                                     start=c.start, end=c.end, text=c.text))
        rows = _DocRows(d)
        _deterministic(d, rows, email_keys, ontology, report)
        _from_llm(o, rows, report, ontology)
        report.gleaning_failures += o.gleaning_failures
        _join(rows, batch, report)
    return batch


def failure_record(doc_id: str, stream: str, path: str, digest: str | None, error: str,
                   message: str, attempts: int, **extra: Any) -> dict[str, Any]:
    return {"id": doc_id, "path": path, "stream": stream, "hash": digest, "error": error,
            "message": message, "attempts": attempts,
            "time": datetime.now(UTC).isoformat(timespec="seconds"), **extra}


def record_failures(docs: Iterable[Document]) -> list[dict[str, Any]]:
    """One failure per bad record of a loaded file, id "<document id>#<index>". The file's good
    records go on as usual (extracted, or skipped while the file is unchanged); the bad ones
    are listed again on every run until the file is fixed, like an unreadable file."""
    return [failure_record(f"{d.id}#{b['record']}", d.stream, d.path, d.hash, "RecordError",
                           f"{b['reason']} — fix or remove the record; the file's other "
                           "records are used", 0, record=b["record"])
            for d in docs for b in d.bad_records]


def run_sync(coro: Any) -> Any:
    """asyncio.run, also from a thread that already has a running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def process_batch(docs: list[Document], store: GraphStore, client: LLMClient, model: str,
                  chunk_tokens: int, overlap_tokens: int, schema: dict[str, Any],
                  changed: set[str], on_done: Callable[[DocOutcome], None] | None = None,
                  ontology: GraphSchema | None = None, gleanings: int = 0) -> BatchReport:
    """Extract a batch of documents and write it to the graph.

    Order makes a crash harmless: retract what changed documents contributed before, upsert
    (idempotent MERGEs), and only then mark the documents extracted. A crash anywhere leaves
    them unmarked, so the next run does them again and reaches the same graph. Documents the
    client's deadline deferred are listed in `deferred` and left alone: not written, not
    marked, not failed."""
    report = BatchReport()
    client = replace(client, usage=Usage())
    ontology = ontology or default_schema()
    outcomes = run_sync(extract_documents(client, docs, chunk_tokens, overlap_tokens, schema,
                                          on_done, ontology=ontology, gleanings=gleanings))
    report.usage = client.usage
    report.deferred = [o.doc.id for o in outcomes if o.deferred]
    for o in outcomes:
        if o.error:
            d = o.doc
            msg = o.error + (" — the endpoint was unreachable (node down or preempted?): "
                             "retried on the next run" if o.endpoint_down else
                             " — the server never answered (timeouts): retried on the next run"
                             if o.unanswered else "")
            report.failed.append(failure_record(d.id, d.stream, d.path, d.hash,
                                                o.error_type or "Error", msg, o.attempts,
                                                model=model, prompt_version=document_version(
                                                    d, ontology, gleanings),
                                                held=not o.unanswered))
    emails = [e for o in outcomes if not (o.error or o.deferred)
              for r in o.doc.records for e in r["emails"]]

    def write() -> tuple[GraphBatch, BatchReport]:
        labels = BatchReport()  # label counts of this attempt only
        batch = build_batch(outcomes, model, store.keys_by_email(emails), labels, ontology,
                            gleanings)
        retract = [d["id"] for d in batch.documents if d["id"] in changed]
        if retract:
            store.retract(retract)
        store.upsert(batch)
        store.mark_extracted(batch.documents)
        held = [f for f in report.failed if f["held"]]  # the rest is simply done next run
        if held:
            store.mark_failed(held)
        return batch, labels

    # The LLM work is done and paid for: a graph hiccup retries the writes, not the calls.
    # (All writes are idempotent MERGEs, and the extraction mark comes last.)
    wrote = time.monotonic()
    for attempt in range(GRAPH_ATTEMPTS):
        try:
            batch, labels = write()
            break
        except GraphError:
            if attempt == GRAPH_ATTEMPTS - 1:
                raise
            time.sleep(backoff_seconds(attempt, GRAPH_RETRY_SECONDS, GRAPH_RETRY_CAP_SECONDS))
    report.write_seconds = time.monotonic() - wrote
    report.add_labels(labels)
    for d in batch.documents:
        report.extracted[d["stream"]] += 1
    report.entities = len(batch.entities)
    report.relationships = len(batch.relationships)
    return report


def prompt_overhead_tokens(ontology: GraphSchema | None = None) -> int:
    return estimate_tokens(system_prompt(ontology or default_schema())) + 64


def append_dead_letters(path: Path, records: list[dict[str, Any]]) -> None:
    if not records:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")

