"""Phase-1 logic: plan what to extract, turn documents into graph rows, write them.

Deterministic parts (transcript participants, contact fields) never go to the LLM; free text
does, chunked to fit the endpoint's context. Everything here is plain Python; the Prefect
tasks in tasks/extraction/phase1.py call it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.errors import ChunkTooLong, Deferred, GraphError, LLMError
from tasks.extraction.chunking import chunk_text, estimate_tokens, halve
from tasks.extraction.documents import Document, LoadFailure
from tasks.extraction.llm import LLMClient, Usage
from tasks.extraction.resolve import looks_like_person_name, resolve
from tasks.extraction.schema import (
    PROMPT_VERSION,
    SYSTEM_PROMPT,
    Extraction,
    map_entity_type,
    map_relationship_type,
)
from tasks.graph.store import EntityRow, GraphBatch, GraphStore, RelRow, now_iso

MAX_SPLIT_DEPTH = 2
GRAPH_ATTEMPTS = 3
GRAPH_RETRY_SECONDS = 1.0


@dataclass
class Plan:
    extract: list[Document]
    skipped: list[Document]
    changed: list[str]  # ids already in the graph whose content (or model/prompt) changed
    deleted: list[str]  # ids in the graph whose file is gone
    held: list[tuple[Document, str]] = field(default_factory=list)  # failed before, unchanged


def plan(docs: list[Document], failures: list[LoadFailure], states: dict[str, dict[str, Any]],
         streams: Iterable[str], model: str, full: bool = False,
         retry_failed: bool = False) -> Plan:
    """Decide per document: skip (unchanged since its last successful extraction), hold
    (unchanged since it failed), extract, or retract (deleted). A file that now fails to load
    keeps its old graph contribution."""
    out = Plan([], [], [], [])
    key = (model, PROMPT_VERSION)
    for d in docs:
        st = states.get(d.id) or {}
        fresh = (st.get("hash"), st.get("model"), st.get("prompt_version")) == (d.hash, *key)
        failed = (st.get("failed_hash"), st.get("failed_model"),
                  st.get("failed_prompt_version")) == (d.hash, *key)
        if fresh and not full:
            out.skipped.append(d)
        elif failed and not (full or retry_failed):
            out.held.append((d, str(st.get("failed_reason"))))
        else:
            out.extract.append(d)
            if st:
                out.changed.append(d.id)
    present = {d.id for d in docs} | {f.id for f in failures}
    streams = set(streams)
    out.deleted = sorted(i for i, st in states.items()
                         if i not in present and st.get("stream") in streams)
    return out


@dataclass
class DocOutcome:
    doc: Document
    extraction: list[Extraction] = field(default_factory=list)
    error: str | None = None
    error_type: str | None = None
    attempts: int = 0
    endpoint_down: bool = False  # failed because the endpoint was unreachable: not held
    unanswered: bool = False  # no attempt got an answer (timeouts, server down): not held
    # the deadline could not cover one of its requests: neither extracted nor failed, it
    # waits for the next run (what its other chunks returned is dropped)
    deferred: bool = False


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
    write_seconds: float = 0.0  # the graph writes' time (phase 1 keeps it back from its budget)


def user_prompt(doc: Document, chunk: str, part: int, parts: int) -> str:
    title = doc.metadata.get("title") or doc.id
    head = f"Document: {title} ({doc.stream})"
    if parts > 1:
        head += f", part {part} of {parts}"
    return f"{head}\n---\n{chunk}"


async def _extract_chunk(client: LLMClient, doc: Document, chunk: str, schema: dict[str, Any],
                         depth: int, part: int, parts: int) -> list[Extraction]:
    try:
        return [await client.extract(SYSTEM_PROMPT, user_prompt(doc, chunk, part, parts), schema)]
    except ChunkTooLong as e:
        halves = halve(chunk)
        if depth >= MAX_SPLIT_DEPTH or len(halves) < 2:
            if "max_tokens" not in str(e):
                raise  # the prompt itself does not fit
            # Nothing left to split: the answer, not the chunk, is too long (greedy decoding
            # that loops) — other samples of the same chunk.
            return [await client.extract(SYSTEM_PROMPT, user_prompt(doc, chunk, part, parts),
                                         schema, resample_cut=True)]
        results = await asyncio.gather(*(
            _extract_chunk(client, doc, h, schema, depth + 1, part, parts) for h in halves))
        return [x for r in results for x in r]


async def extract_document(client: LLMClient, doc: Document, chunk_tokens: int,
                           overlap_tokens: int, schema: dict[str, Any]) -> DocOutcome:
    """Run the document's free text through the LLM, chunk by chunk (concurrently). Every
    chunk ends before the outcome is decided (no request outlives its document): a failed
    chunk fails the document, else a deferred one defers it."""
    outcome = DocOutcome(doc)
    if not doc.text.strip():
        return outcome
    chunks = chunk_text(doc.text, chunk_tokens, overlap_tokens)
    results = await asyncio.gather(*(
        _extract_chunk(client, doc, c, schema, 0, i + 1, len(chunks))
        for i, c in enumerate(chunks)), return_exceptions=True)
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
        outcome.extraction = [x for r in results if isinstance(r, list) for x in r]
    return outcome


async def extract_documents(client: LLMClient, docs: list[Document], chunk_tokens: int,
                            overlap_tokens: int, schema: dict[str, Any],
                            on_done: Callable[[DocOutcome], None] | None = None
                            ) -> list[DocOutcome]:
    async def one(d: Document) -> DocOutcome:
        outcome = await extract_document(client, d, chunk_tokens, overlap_tokens, schema)
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


def _deterministic(doc: Document, batch: GraphBatch, email_keys: dict[str, str]) -> None:
    if doc.stream == "transcripts":
        meeting = _entity("Event", str(doc.metadata.get("title") or doc.id),
                          f"Meeting {doc.metadata.get('meeting_id', '')}".strip())
        batch.add_entity(meeting, doc.id)
        for raw in doc.metadata.get("participants", []):
            if not looks_like_person_name(raw):
                continue
            person = _entity("Person", raw)
            batch.add_entity(person, doc.id)
            batch.add_relationship(RelRow(person.key, "PARTICIPATED_IN", meeting.key, [doc.id]))
    elif doc.stream == "contacts":
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
            batch.add_entity(person, doc.id)
            if rec.get("organization"):
                org = _entity("Organization", rec["organization"])
                batch.add_entity(org, doc.id)
                batch.add_relationship(RelRow(person.key, "WORKS_FOR", org.key, [doc.id],
                                              rec.get("title") or ""))


def _from_llm(outcome: DocOutcome, batch: GraphBatch, report: BatchReport) -> None:
    doc = outcome.doc
    for ex in outcome.extraction:
        # labels were mapped (or their items dropped) and unknown fields dropped on the way in
        report.rejected_entity_types.update(ex.repairs.rejected_entity_types)
        report.remapped_relationship_types.update(ex.repairs.remapped_relationship_types)
        report.dropped_fields.update(ex.repairs.dropped_fields)
        by_name: dict[str, str] = {}
        for ent in ex.entities:
            label = map_entity_type(ent.type)
            if label is None or not ent.name.strip():
                report.rejected_entity_types[ent.type or "(empty)"] += 1
                continue
            row = _entity(label, ent.name[:200], ent.description[:500])
            batch.add_entity(row, doc.id)
            for n in (ent.name.strip(), row.name):
                by_name.setdefault(n.casefold(), row.key)
        for rel in ex.relationships:
            src = by_name.get(rel.source.strip().casefold())
            dst = by_name.get(rel.target.strip().casefold())
            if not src or not dst or src == dst:
                report.dangling_relationships += 1
                continue
            rtype, remapped = map_relationship_type(rel.type)
            if remapped:
                report.remapped_relationship_types[rel.type] += 1
            batch.add_relationship(RelRow(src, rtype, dst, [doc.id], rel.description[:500]))


def build_batch(outcomes: list[DocOutcome], model: str, email_keys: dict[str, str],
                report: BatchReport) -> GraphBatch:
    batch = GraphBatch()
    now = now_iso()
    for o in outcomes:
        if o.error or o.deferred:
            continue
        d = o.doc
        batch.documents.append({"id": d.id, "stream": d.stream, "path": d.path, "hash": d.hash,
                                "model": model, "prompt_version": PROMPT_VERSION,
                                "extracted_at": now})
        _deterministic(d, batch, email_keys)
        _from_llm(o, batch, report)
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
                  changed: set[str], on_done: Callable[[DocOutcome], None] | None = None
                  ) -> BatchReport:
    """Extract a batch of documents and write it to the graph.

    Order makes a crash harmless: retract what changed documents contributed before, upsert
    (idempotent MERGEs), and only then mark the documents extracted. A crash anywhere leaves
    them unmarked, so the next run does them again and reaches the same graph. Documents the
    client's deadline deferred are listed in `deferred` and left alone: not written, not
    marked, not failed."""
    report = BatchReport()
    client = replace(client, usage=Usage())
    outcomes = run_sync(extract_documents(client, docs, chunk_tokens, overlap_tokens, schema,
                                          on_done))
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
                                                model=model, prompt_version=PROMPT_VERSION,
                                                held=not o.unanswered))
    emails = [e for o in outcomes if not (o.error or o.deferred)
              for r in o.doc.records for e in r["emails"]]

    def write() -> tuple[GraphBatch, BatchReport]:
        labels = BatchReport()  # label counts of this attempt only
        batch = build_batch(outcomes, model, store.keys_by_email(emails), labels)
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
            time.sleep(GRAPH_RETRY_SECONDS * 2**attempt)
    report.write_seconds = time.monotonic() - wrote
    report.rejected_entity_types = labels.rejected_entity_types
    report.remapped_relationship_types = labels.remapped_relationship_types
    report.dropped_fields = labels.dropped_fields
    report.dangling_relationships = labels.dangling_relationships
    for d in batch.documents:
        report.extracted[d["stream"]] += 1
    report.entities = len(batch.entities)
    report.relationships = len(batch.relationships)
    return report


def prompt_overhead_tokens() -> int:
    return estimate_tokens(SYSTEM_PROMPT) + 64


def append_dead_letters(path: Path, records: list[dict[str, Any]]) -> None:
    if not records:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")

