"""Phase 1 as a flow: the day's documents → LLM → property graph.

Runs inside the nightly flow, or on its own against a running endpoint:
    prefect deployment run 'extract/ad-hoc' -p base_url=http://127.0.0.1:8080
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, cast
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.runtime import flow_run as current_run

from tasks.errors import PhaseFailed
from tasks.extraction.extract import (
    append_dead_letters,
    failure_record,
    plan,
    record_failures,
)
from tasks.extraction.inputs import chunk_tokens as chunk_size
from tasks.extraction.inputs import llm_client, response_schema, source_roots
from tasks.extraction.llm import Usage
from tasks.extraction.phase1 import (
    count_documents,
    extract_batch,
    prune_orphans,
    publish_report,
    retract_deleted,
    scan_documents,
)
from tasks.graph.open import embedded_port, open_graph
from tasks.graph.snapshots import GraphDamaged, Ledger, damage_message, keep_snapshot
from tasks.graph.store import batched
from tasks.profile import load_profile
from tasks.records import DocumentCounts, ExtractionReport, GraphSummary


@flow(name="extract", log_prints=True)
def extract(profile: str = "local", base_url: str | None = None, full: bool = False,
            retry_failed: bool = False, max_failed_share: float | None = None
            ) -> dict[str, Any]:
    """Extract entities and relationships from every new or changed document into the graph.

    Unchanged documents (same content hash, model and prompt version) are skipped, and so are
    unchanged ones that failed before unless `retry_failed`; deleted ones lose their
    provenance; failures go to the dead-letter file with their reasons."""
    logger = get_run_logger()
    started = time.monotonic()
    cfg = load_profile(profile)
    endpoint = cfg.inference
    share = cfg.extraction.max_failed_share if max_failed_share is None else max_failed_share
    roots = source_roots(cfg.sources)
    client = llm_client(endpoint, base_url)
    schema = response_schema(endpoint)
    chunk_tokens = chunk_size(endpoint)

    usage = Usage()
    extracted: Counter[str] = Counter()
    failed: list[dict[str, Any]] = []
    rejected: Counter[str] = Counter()
    remapped: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    dangling = entities = relationships = 0
    run_id = current_run.get_id()
    ledger = Ledger(cfg.state_dir, cfg.graph.describe())
    keep = cfg.graph.snapshots_to_keep()
    with open_graph(cfg.graph, progress=logger.info) as store:
        check, why = ledger.check(store.stats())
        if check == "damaged" and not full:
            raise GraphDamaged(damage_message(why, profile, cfg.snapshot_root(),
                                              cfg.snapshot_gcs_block(), keep > 0))
        logger.info("graph check: %s — %s%s", check, why,
                    " (re-extracting every document: --full)" if check == "damaged" else "")
        docs, load_failures = scan_documents(roots, int(cfg.sources.max_document_mb * 1e6))
        work = plan(docs, load_failures, store.document_states(), roots, endpoint.model, full,
                    retry_failed)
        wrote = bool(work.deleted or work.extract)
        if wrote:
            ledger.begin_write(run_id)
        logger.info("%d to extract, %d unchanged (skipped), %d unchanged since they failed "
                    "(held; retry with --retry-failed), %d deleted, %d unreadable",
                    len(work.extract), len(work.skipped), len(work.held), len(work.deleted),
                    len(load_failures))
        if work.deleted:
            retract_deleted(store, work.deleted)
        progress = cast(UUID, create_progress_artifact(
            0.0, key="extraction-progress", description="Phase 1: documents extracted (%)"))
        batches = list(batched(work.extract, cfg.extraction.batch_documents))
        done = 0
        changed = set(work.changed)
        for i, batch in enumerate(batches, 1):
            rep = extract_batch(list(batch), store, client, endpoint.model, chunk_tokens,
                                endpoint.chunk_overlap_tokens, schema, changed)
            usage.add(rep.usage)
            extracted.update(rep.extracted)
            failed.extend(rep.failed)
            rejected.update(rep.rejected_entity_types)
            remapped.update(rep.remapped_relationship_types)
            dropped.update(rep.dropped_fields)
            dangling += rep.dangling_relationships
            entities += rep.entities
            relationships += rep.relationships
            done += len(batch)
            update_progress_artifact(progress, 100.0 * done / max(len(work.extract), 1))
            logger.info("batch %d/%d: %d/%d documents, %d LLM calls so far, %d failed",
                        i, len(batches), done, len(work.extract), usage.calls, len(failed))
        pruned = prune_orphans(store) if (work.deleted or work.changed) else 0
        graph_stats = store.stats()
        ledger.record(graph_stats, run_id)
        top = store.top_entities(10)
        location = store.location
        snapshot = keep_snapshot(embedded_port(cfg.graph), cfg.snapshot_root(), graph_stats,
                                 cfg.graph.describe(), keep, cfg.snapshot_gcs_block(), run_id,
                                 changed=wrote)
        if snapshot and snapshot.get("error"):
            logger.warning("graph snapshot not taken: %s", snapshot["error"])

    load_failed = [failure_record(f.id, f.stream, f.path, f.hash, "DocumentError", f.reason, 0)
                   for f in load_failures]
    held = [failure_record(d.id, d.stream, d.path, d.hash, "HeldAfterFailure",
                           f"unchanged since it failed ({reason}); not retried — fix the "
                           "document or run with --retry-failed", 0) for d, reason in work.held]
    bad_records = record_failures(docs)  # listed every run until fixed, like load failures
    dead_letter = cfg.state_dir / "dead-letter.jsonl"
    append_dead_letters(dead_letter, load_failed + bad_records + failed)
    all_failures = load_failed + bad_records + failed + held
    counts = count_documents(docs, load_failures, work.skipped, extracted, failed + held,
                             list(roots))
    summary = ExtractionReport(
        documents={stream: DocumentCounts(**c) for stream, c in counts.items()},
        llm_calls=usage.calls,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        llm_retries=usage.retries,
        entities=entities,
        relationships=relationships,
        deleted=len(work.deleted),
        pruned=pruned,
        rejected_entity_types=dict(rejected),
        remapped_relationship_types=dict(remapped),
        dropped_fields=dict(dropped),
        unusable_answers=dict(usage.unusable_answers),
        bad_records=dict(Counter(r["stream"] for r in bad_records)),
        dangling_relationships=dangling,
        failures=all_failures,
        dead_letter=str(dead_letter.resolve()) if all_failures else None,
        graph=GraphSummary(location=location, description=cfg.graph.describe(), **graph_stats,
                           check=check, snapshot=snapshot),
        seconds=round(time.monotonic() - started, 2),
    ).model_dump(mode="json")  # the record checks the keys; the flow returns its JSON form
    publish_report(summary, top)
    attempted = len(work.extract) + len(load_failures)
    if attempted and len(load_failed + failed) / attempted > share:
        raise PhaseFailed(f"{len(load_failed + failed)} of {attempted} documents failed (more than "
                          f"{share:.0%}); reasons in {dead_letter} — fix them or raise "
                          "max_failed_share", summary)
    return summary
