"""Phase 1's batch: extract a batch of documents and write it to the graph (crash-safe: retract,
upsert, mark), the failure rows and the dead-letter file. Everything here is plain Python; the
Prefect tasks in tasks/extraction/stages.py call it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.extraction.answers import BatchReport, ColleagueLookup, PeopleLookup, build_batch
from tasks.extraction.calls import DocOutcome, ExtractionConfig, extract_documents, run_sync
from tasks.extraction.documents import Document, LoadFailure
from tasks.extraction.judge import Candidate, Judge
from tasks.extraction.llm import LLMClient, Usage
from tasks.extraction.prompt import document_version
from tasks.extraction.resolve import phone_key, resolve
from tasks.extraction.rows import tel
from tasks.graph.ontology import GraphSchema
from tasks.graph.store import GraphBatch, GraphStore
from tasks.records import FailedDocument
from tasks.shared.errors import GraphError
from tasks.shared.waiting import backoff_seconds

GRAPH_ATTEMPTS = 3
GRAPH_RETRY_SECONDS = 1.0
GRAPH_RETRY_CAP_SECONDS = GRAPH_RETRY_SECONDS * 2 ** (GRAPH_ATTEMPTS - 2)  # the old longest wait


def failure_record(of: Document | LoadFailure, error: str, message: str, attempts: int = 0,
                   **extra: Any) -> FailedDocument:
    """A failure row of document `of` (its id, stream, path and hash), stamped now; `extra`:
    the keys only some rows have (model, …, or an `id` of one record in the file)."""
    row: dict[str, Any] = {"id": of.id, "path": of.path, "stream": of.stream, "hash": of.hash,
                           **extra}
    return FailedDocument(**row, error=error, message=message, attempts=attempts,
                          time=datetime.now(UTC).isoformat(timespec="seconds"))


def record_failures(docs: Iterable[Document]) -> list[FailedDocument]:
    """One failure per bad record of a loaded file, id "<document id>#<index>". The file's good
    records go on as usual (extracted, or skipped while the file is unchanged); the bad ones
    are listed again on every run until the file is fixed, like an unreadable file."""
    return [failure_record(d, "RecordError", f"{b['reason']} — fix or remove the record; the "
                           "file's other records are used", id=f"{d.id}#{b['record']}",
                           record=b["record"])
            for d in docs for b in d.bad_records]


def known_people(store: GraphStore, docs: Iterable[Document]) -> dict[str, str]:
    """E-mail address → Person key, of what the graph holds for these documents' contacts: the
    Persons that hold their addresses, and every address of the Persons of their names (a
    namesake's evidence: tasks/extraction/rows.py contact_rows); and "tel:" + phone key →
    Person key for the phones of the Persons of the names of contacts that give one."""
    records = [r for d in docs for r in d.records if r.get("name")]
    known = store.keys_by_email([e for r in records for e in r["emails"]],
                                [resolve("Person", r["name"])[0] for r in records if r["emails"]])
    names = [resolve("Person", r["name"])[0] for r in records if r["phones"]]
    phones = store.phones_of_names(names) if names else []
    return known | {k: key for phone, key in phones if (k := tel(phone))}


def people_named(store: GraphStore) -> PeopleLookup:
    """The graph's Persons of each name a batch mentions alone, as build_batch asks for them."""
    def lookup(names: set[str]) -> dict[str, list[Candidate]]:
        out: dict[str, list[Candidate]] = {}
        for r in store.people_named(names):
            out.setdefault(r["name"], []).append(Candidate(
                r["key"], frozenset(r["emails"] or ()), frozenset(r["employers"]),
                frozenset(k for p in r["phones"] or () if (k := phone_key(p)))))
        return out
    return lookup


def colleagues_of(store: GraphStore) -> ColleagueLookup:
    """The graph's Persons at each organization, as build_batch asks for them."""
    def lookup(orgs: set[str]) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for r in store.colleagues(orgs):
            out.setdefault(r["org"], {})[r["key"]] = r["name"]
        return out
    return lookup


def resolved_batch(outcomes: list[DocOutcome], store: GraphStore, model: str,
                   report: BatchReport, ontology: GraphSchema | None = None, gleanings: int = 0,
                   judge: Judge | None = None) -> GraphBatch:
    """The batch `outcomes` write, resolved against what `store` holds: the addresses and
    phones of their contacts' names, the Persons of the names written alone, the splits, the
    colleagues at a contact's employer (build_batch)."""
    docs = [o.doc for o in outcomes if not (o.error or o.deferred)]
    return build_batch(outcomes, model, known_people(store, docs), report, ontology, gleanings,
                       people_named(store), store.splits(), judge, colleagues_of(store))


def process_batch(docs: list[Document], store: GraphStore, client: LLMClient, ask: ExtractionConfig,
                  changed: set[str], on_done: Callable[[DocOutcome], None] | None = None
                  ) -> BatchReport:
    """Extract a batch of documents with `ask` and write it to the graph (`changed`: the ids
    whose earlier contribution is retracted first).

    Order makes a crash harmless: retract what changed documents contributed before, upsert
    (idempotent MERGEs), and only then mark the documents extracted. A crash anywhere leaves
    them unmarked, so the next run does them again and reaches the same graph. Documents the
    client's deadline deferred are listed in `deferred` and left alone: not written, not
    marked, not failed."""
    report = BatchReport()
    client = replace(client, usage=Usage())
    model, ontology, gleanings = ask.model, ask.ontology, ask.gleanings
    outcomes = run_sync(extract_documents(client, ask, docs, on_done))
    report.usage = client.usage
    report.deferred = [o.doc.id for o in outcomes if o.deferred]
    for o in outcomes:
        if o.error:
            d = o.doc
            msg = o.error + (" — the endpoint was unreachable (node down or preempted?): "
                             "retried on the next run" if o.endpoint_down else
                             " — the server never answered (timeouts): retried on the next run"
                             if o.unanswered else "")
            report.failed.append(failure_record(d, o.error_type or "Error", msg, o.attempts,
                                                model=model, prompt_version=document_version(
                                                    d, ontology, gleanings),
                                                held=not o.unanswered))
    judge = Judge(client) if ask.judge else None  # asked once per name, whatever write() retries

    def write() -> tuple[GraphBatch, BatchReport]:
        labels = BatchReport()  # label counts of this attempt only
        batch = resolved_batch(outcomes, store, model, labels, ontology, gleanings, judge)
        retract = [d["id"] for d in batch.documents if d["id"] in changed]
        if retract:
            store.retract(retract)
        store.upsert(batch)
        store.mark_extracted(batch.documents)
        held = [f for f in report.failed if f.held]  # the rest is simply done next run
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


def append_dead_letters(path: Path, records: list[FailedDocument]) -> None:
    """One JSON line per row, appended (the file is the history of what failed)."""
    if not records:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r.model_dump(mode="json"), ensure_ascii=False) + "\n")
