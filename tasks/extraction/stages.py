"""Prefect tasks of phase 1. Documents travel in batches: one task per batch, never per document."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from tasks.extraction.answers import BatchReport
from tasks.extraction.batch import process_batch
from tasks.extraction.calls import DocOutcome, ExtractionConfig
from tasks.extraction.documents import Document, LoadFailure, scan
from tasks.extraction.llm import LLMClient
from tasks.graph.store import GraphStore
from tasks.records import ExtractionReport, FailedDocument


@task(name="scan-documents", cache_policy=NO_CACHE)
def scan_documents(roots: dict[str, Path], max_bytes: int) -> tuple[list[Document], list[LoadFailure]]:
    """Load every document of every stream; unreadable ones come back as failures with reasons."""
    docs, failures = scan(roots, max_bytes)
    get_run_logger().info("scanned %d documents (%d could not be loaded) in %s", len(docs) +
                          len(failures), len(failures), ", ".join(str(r) for r in roots.values()))
    return docs, failures


@task(name="retract-deleted", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def retract_deleted(store: GraphStore, doc_ids: list[str]) -> int:
    """Remove the provenance of documents whose files are gone."""
    store.retract(doc_ids, delete=True)
    return len(doc_ids)


@task(name="extract-batch", cache_policy=NO_CACHE)
def extract_batch(docs: list[Document], store: GraphStore, client: LLMClient, ask: ExtractionConfig,
                  changed: set[str]) -> BatchReport:
    """Extract a batch of documents with the LLM and upsert the result (graph writes are
    retried inside; LLM calls are never repeated for a graph error; `changed`: the ids whose
    earlier contribution is retracted first)."""
    logger = get_run_logger()
    done = [0]
    step = 1 if len(docs) <= 50 else len(docs) // 10  # every document, or every 10%

    def progress(outcome: DocOutcome) -> None:
        done[0] += 1
        if done[0] % step == 0 or done[0] == len(docs) or outcome.error:
            status = f"FAILED: {outcome.error}" if outcome.error else \
                "pending (out of budget: first on the next run)" if outcome.deferred else "ok"
            logger.info("  %d/%d %s — %s", done[0], len(docs), outcome.doc.id, status)

    return process_batch(docs, store, client, ask, changed, progress)


@task(name="prune-orphans", cache_policy=NO_CACHE)
def prune_orphans(store: GraphStore) -> int:
    """Delete entities no document mentions any more."""
    return store.prune_orphans()


def markdown_report(report: ExtractionReport, top: list[dict[str, Any]]) -> str:
    r = report
    lines = ["# Phase 1: extraction", "",
             "| stream | seen | extracted | skipped (unchanged) | failed |",
             "|---|---:|---:|---:|---:|"]
    for stream, c in r.documents.items():
        lines.append(f"| {stream} | {c.seen} | {c.extracted} | {c.skipped} | {c.failed} |")
    lines += ["", f"LLM calls: {r.llm_calls} · prompt tokens: {r.prompt_tokens} · "
              f"completion tokens: {r.completion_tokens} · retries: {r.llm_retries}",
              f"Entities upserted: {r.entities} · relationships upserted: "
              f"{r.relationships} · documents retracted (deleted): {r.deleted} · "
              f"orphan entities pruned: {r.pruned}", ""]
    if r.rejected_entity_types or r.remapped_relationship_types:
        lines += [f"Rejected entity types: {r.rejected_entity_types} · relationship "
                  f"types mapped to RELATED_TO: {r.remapped_relationship_types} · "
                  f"relationships with unknown endpoints: {r.dangling_relationships}", ""]
    q = r.quality
    if q is not None and q.grounded_names + q.ungrounded_names:
        lines += [f"Grounded precision: {q.grounded_precision} ({q.grounded_names} of "
                  f"{q.grounded_names + q.ungrounded_names} names occur in their chunk) · "
                  f"ungrounded names dropped: {q.dropped_ungrounded} · "
                  f"pruned (no pattern): {q.pruned_relationships} · turned around: "
                  f"{q.reversed_relationships} · surnames joined: {q.aliases_resolved} · "
                  f"extraction version {q.extraction_version}", ""]
        if q.ungrounded:
            lines += ["Ungrounded names (first few): " + "; ".join(
                n.replace("|", "\\|") for n in q.ungrounded), ""]
    if r.unusable_answers or r.dropped_fields or r.bad_records:
        lines += [f"Unusable answers (retried with other sampling), by reason: "
                  f"{r.unusable_answers} · unknown fields dropped: "
                  f"{r.dropped_fields} · bad records skipped (the file's other records "
                  f"used): {r.bad_records}", ""]
    if r.unlinked_people:
        lines += ["## Names linked to no one", "",
                  "Each names a person that several Persons of the graph could be; its document "
                  "fits none or several of them, so it is linked to none (the judge's reasons, "
                  "where [extraction] judge asked the model).", "",
                  "| document | name | could be | facts not written | the judge |",
                  "|---|---|---|---:|---|"]
        lines += [f"| {u.document} | {u.name} | {', '.join(u.candidates)} | {u.relationships} "
                  f"| {u.judge.replace('|', '/') or '—'} |" for u in r.unlinked_people]
        lines.append("")
    if r.failures:
        lines += ["## Failed documents and records", "",
                  "| document | error | reason |", "|---|---|---|"]
        for f in r.failures:
            reason = str(f.message).replace("|", "\\|").replace("\n", " ")[:300]
            lines.append(f"| {f.id} | {f.error} | {reason} |")
        lines.append("")
    if top:
        lines += ["## Top entities", "", "| entity | type | documents |", "|---|---|---:|"]
        lines += [f"| {t['name']} | {t['type']} | {t['documents']} |" for t in top]
    return "\n".join(lines)


@task(name="publish-extraction-report", cache_policy=NO_CACHE)
def publish_report(report: ExtractionReport, top: list[dict[str, Any]]) -> None:
    create_markdown_artifact(markdown_report(report, top), key="extraction-report",
                             description="Phase 1: counts, failures with reasons, top entities")


def count_documents(docs: list[Document], failures: list[LoadFailure], skipped: list[Document],
                    extracted: Counter[str], failed: list[FailedDocument],
                    streams: list[str]) -> dict[str, dict[str, int]]:
    out = {s: {"seen": 0, "extracted": 0, "skipped": 0, "failed": 0} for s in streams}
    for d in docs:
        out[d.stream]["seen"] += 1
    for f in failures:
        out[f.stream]["seen"] += 1
        out[f.stream]["failed"] += 1
    for d in skipped:
        out[d.stream]["skipped"] += 1
    for s, n in extracted.items():
        out[s]["extracted"] += n
    for rec in failed:
        out[rec.stream]["failed"] += 1
    return out
