"""Phase 1 as a flow: the day's documents → LLM → property graph.

Runs inside the nightly flow, or on its own against a running endpoint:
    prefect deployment run 'extract/ad-hoc' -p base_url=http://127.0.0.1:8080
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.runtime import flow_run as current_run

from blocks.compute import LocalCompute
from tasks.compute.inference_server import server_exit
from tasks.errors import PhaseFailed, ServerDied
from tasks.extraction.chunking import estimate_tokens
from tasks.extraction.extract import (
    BatchReport,
    append_dead_letters,
    failure_record,
    plan,
    record_failures,
)
from tasks.extraction.inputs import chunk_tokens as chunk_size
from tasks.extraction.inputs import llm_client, response_schema, source_roots
from tasks.extraction.llm import Usage
from tasks.extraction.stages import (
    count_documents,
    extract_batch,
    prune_orphans,
    publish_report,
    retract_deleted,
    scan_documents,
)
from tasks.extraction.prompt import extraction_version
from tasks.files import write_atomic
from tasks.graph.open import embedded_port, open_graph
from tasks.graph.snapshots import GraphDamaged, Ledger, damage_message, keep_snapshot
from tasks.graph.store import batched
from tasks.profile import load_profile
from tasks.records import (
    AnswerQuality,
    DocumentCounts,
    ExtractionReport,
    GraphSummary,
    grounded_precision,
)

PENDING_FILE = "phase1-pending.json"  # <state_dir>/…: documents a budget left, first next run
# Kept back from the budget for what follows the last requests: that batch's graph writes, the
# orphan prune, the stats and the snapshot. FINISH_RESERVE_SECONDS until a batch write is
# measured; then FINISH_FLOOR_SECONDS + 1.5 × the slowest write measured (bench/deadline.py: a
# 0.2 s write, 0.2 s of finishing — a fixed 2 s ended a 40 s budget 5.9 % early).
FINISH_RESERVE_SECONDS = 2.0
FINISH_FLOOR_SECONDS = 0.25


def _pending_first(state_dir: Any, docs: list[Any]) -> tuple[list[Any], int]:
    """The documents a budget left pending last time go first (in their order), then the rest;
    and how many of them are still to do."""
    path = state_dir / PENDING_FILE
    try:
        ids = json.loads(path.read_text(encoding="utf-8")).get("ids", [])
    except (OSError, ValueError, AttributeError):
        return docs, 0
    rank = {i: n for n, i in enumerate(ids)}
    first = sorted((d for d in docs if d.id in rank), key=lambda d: rank[d.id])
    return first + [d for d in docs if d.id not in rank], len(first)


def _save_pending(state_dir: Any, ids: list[str]) -> None:
    path = state_dir / PENDING_FILE
    if not ids:
        path.unlink(missing_ok=True)
        return
    write_atomic(path, json.dumps({"ids": ids, "written_at": datetime.now(UTC).isoformat(
        timespec="seconds")}, indent=1))


@flow(name="extract", log_prints=True)
def extract(profile: str = "local", base_url: str | None = None, full: bool = False,
            retry_failed: bool = False, max_failed_share: float | None = None,
            base_urls: list[str] | None = None, deadline: float | None = None,
            budget_seconds: float | None = None) -> dict[str, Any]:
    """Extract entities and relationships from every new or changed document into the graph.

    Unchanged documents (same content hash, model and prompt version) are skipped, and so are
    unchanged ones that failed before unless `retry_failed`; deleted ones lose their
    provenance; failures go to the dead-letter file with their reasons.

    `base_urls`: several endpoints (one per node) sharing the work, each under its own
    adaptive limit. `deadline` (epoch seconds) or `budget_seconds` (from now): phase 1 stops
    dispatching when what is left cannot cover the next request, lets the requests in flight
    finish, and ends `partial`: the documents it did not reach stay pending (not failed, not
    held) and go first on the next run."""
    logger = get_run_logger()
    started = time.monotonic()
    began = time.time()
    if budget_seconds is not None:
        own = began + max(0.0, budget_seconds)
        deadline = own if deadline is None else min(deadline, own)
    cfg = load_profile(profile)
    endpoint = cfg.inference
    share = cfg.extraction.max_failed_share if max_failed_share is None else max_failed_share
    roots = source_roots(cfg.sources)
    urls = [u for u in (base_urls or []) if u] or None
    reserve = FINISH_RESERVE_SECONDS
    slowest = 0.0
    # A local server is this run's own: when it dies, phase 1 says how and stops asking it.
    watch = partial(server_exit, Path(cfg.compute.state_dir)) \
        if isinstance(cfg.compute, LocalCompute) else None
    client = llm_client(endpoint, base_url, base_urls=urls,
                        deadline=None if deadline is None else deadline - reserve,
                        server_exit=watch)
    ontology = cfg.extraction.ontology()
    gleanings = cfg.extraction.gleanings
    schema = response_schema(endpoint, ontology)
    chunk_tokens = chunk_size(endpoint, ontology, gleanings)

    usage = Usage()
    extracted: Counter[str] = Counter()
    failed: list[dict[str, Any]] = []
    quality = BatchReport()  # the answers' label, pattern and grounding counts, summed
    entities = relationships = 0
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
                    retry_failed, ontology, gleanings)
        wrote = bool(work.deleted or work.extract)
        if wrote:
            ledger.begin_write(run_id)
        logger.info("%d to extract, %d unchanged (skipped), %d unchanged since they failed "
                    "(held; retry with --retry-failed), %d deleted, %d unreadable",
                    len(work.extract), len(work.skipped), len(work.held), len(work.deleted),
                    len(load_failures))
        if work.reasons:
            logger.info("extracted again: %s%s", ", ".join(
                f"{n} for {why}" for why, n in sorted(work.reasons.items())),
                f" (graph schema {ontology.path}, digest {ontology.digest()[:8]}; prompt "
                "and schema digests make the extraction version)"
                if work.reasons.get("extraction version") else "")
        if work.deleted:
            retract_deleted(store, work.deleted)
        todo, first = _pending_first(cfg.state_dir, work.extract)
        if first:
            logger.info("%d documents left pending by the last run's budget go first", first)
        if deadline is not None:
            logger.info("phase-1 budget: %.0f s (until %s)", deadline - began,
                        datetime.fromtimestamp(deadline, UTC).isoformat(timespec="seconds"))
        progress = cast(UUID, create_progress_artifact(
            0.0, key="extraction-progress", description="Phase 1: documents extracted (%)"))
        batches = list(batched(todo, cfg.extraction.batch_documents))
        done = 0
        changed = set(work.changed)
        deferred: list[str] = []
        died: str | None = None  # the inference server died: how (ServerDied)
        extract_started = time.monotonic()
        for i, batch in enumerate(batches, 1):
            if deferred:  # the budget closed the gate: the rest waits, no request is sent
                deferred.extend(d.id for d in batch)
                continue
            try:
                rep = extract_batch(list(batch), store, client, endpoint.model, chunk_tokens,
                                    endpoint.chunk_overlap_tokens, schema, changed, ontology,
                                    gleanings)
            except ServerDied as e:
                # Nothing of this batch was written or marked: it and the rest stay pending
                # (first on the next run), none is failed for the server's death.
                died = str(e)
                logger.error("phase 1 stopped: %s", died)
                deferred.extend(d.id for d in batch)
                continue
            deferred.extend(rep.deferred)
            if deadline is not None:  # the slowest write so far sets what is kept back
                slowest = max(slowest, rep.write_seconds)
                reserve = FINISH_FLOOR_SECONDS + 1.5 * slowest
                client.deadline = deadline - reserve
            usage.add(rep.usage)
            extracted.update(rep.extracted)
            failed.extend(rep.failed)
            quality.add_labels(rep)
            entities += rep.entities
            relationships += rep.relationships
            done += len(batch) - len(rep.deferred)
            update_progress_artifact(progress, 100.0 * done / max(len(work.extract), 1))
            logger.info("batch %d/%d: %d/%d documents, %d LLM calls so far, %d failed%s",
                        i, len(batches), done, len(work.extract), usage.calls, len(failed),
                        f", {len(rep.deferred)} pending (out of budget)" if rep.deferred else "")
        extract_seconds = time.monotonic() - extract_started
        _save_pending(cfg.state_dir, deferred)
        by_id = {d.id: d for d in todo}
        pending = Counter(by_id[i].stream for i in deferred)
        pending_tokens = sum(estimate_tokens(by_id[i].text) for i in deferred)
        if deferred and not died:
            logger.warning("phase 1 PARTIAL: the budget ended it with %d documents pending "
                           "(~%d tokens); they go first on the next run", len(deferred),
                           pending_tokens)
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
        rejected_entity_types=dict(quality.rejected_entity_types),
        remapped_relationship_types=dict(quality.remapped_relationship_types),
        dropped_fields=dict(quality.dropped_fields),
        unusable_answers=dict(usage.unusable_answers),
        bad_records=dict(Counter(r["stream"] for r in bad_records)),
        dangling_relationships=quality.dangling_relationships,
        quality=AnswerQuality(
            grounded_names=quality.grounded_names, ungrounded_names=quality.ungrounded_names,
            grounded_precision=grounded_precision(quality.grounded_names,
                                                  quality.ungrounded_names),
            ungrounded=quality.ungrounded,
            dropped_ungrounded=dict(quality.dropped_ungrounded),
            pruned_relationships=dict(quality.pruned_relationships),
            reversed_relationships=dict(quality.reversed_relationships),
            aliases_resolved=quality.aliases_resolved, gleanings=gleanings,
            gleaning_failures=quality.gleaning_failures, graph_schema=ontology.path,
            extraction_version=extraction_version(ontology, gleanings)),
        failures=all_failures,
        dead_letter=str(dead_letter.resolve()) if all_failures else None,
        graph=GraphSummary(location=location, description=cfg.graph.describe(), **graph_stats,
                           check=check, snapshot=snapshot),
        seconds=round(time.monotonic() - started, 2),
        status="partial" if deferred else "completed",
        pending=dict(pending),
        pending_tokens=pending_tokens,
        budget_seconds=None if deadline is None else round(deadline - began, 2),
        extract_seconds=round(extract_seconds, 2),
        endpoints=client.stats(),
    ).model_dump(mode="json")  # the record checks the keys; the flow returns its JSON form
    publish_report(summary, top)
    if died:
        raise PhaseFailed(f"{died}\n{len(deferred)} documents were not extracted: they go "
                          f"first on the next run (listed in {cfg.state_dir / PENDING_FILE})",
                          summary)
    attempted = len(work.extract) - len(deferred) + len(load_failures)
    if attempted and len(load_failed + failed) / attempted > share:
        raise PhaseFailed(f"{len(load_failed + failed)} of {attempted} documents failed (more than "
                          f"{share:.0%}); reasons in {dead_letter} — fix them or raise "
                          "max_failed_share", summary)
    return summary
