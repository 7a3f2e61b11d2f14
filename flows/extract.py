"""Phase 1 as a flow: the day's documents → LLM → property graph.

Runs inside the nightly flow, or on its own against a running endpoint:
    prefect deployment run 'extract/ad-hoc' -p base_url=http://127.0.0.1:8080
"""

from __future__ import annotations

import time
from functools import partial

from prefect import flow, get_run_logger
from prefect.runtime import flow_run as current_run

from tasks.extraction.batch import append_dead_letters
from tasks.extraction.inputs import chunk_tokens as chunk_size
from tasks.extraction.inputs import llm_client, response_schema, source_roots
from tasks.extraction.plan import Plan, plan
from tasks.extraction.run import (
    Budget,
    Failures,
    extraction_report,
    pending_first,
    raise_if_failed,
    run_batches,
)
from tasks.extraction.stages import (
    extract_batch,
    prune_orphans,
    publish_report,
    retract_deleted,
    scan_documents,
)
from tasks.graph.open import open_graph, snapshot_writer
from tasks.graph.snapshots import GraphDamaged, Ledger, damage_message, keep_snapshot
from tasks.ontology import GraphSchema
from tasks.profile import load_profile
from tasks.records import ExtractionReport, GraphSummary, SnapshotFailed


@flow(name="extract", log_prints=True)
def extract(profile: str = "local", base_url: str | None = None, full: bool = False,
            retry_failed: bool = False, max_failed_share: float | None = None,
            base_urls: list[str] | None = None, deadline: float | None = None,
            budget_seconds: float | None = None) -> ExtractionReport:
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
    budget = Budget.of(deadline, budget_seconds)
    cfg = load_profile(profile)
    endpoint, ontology, gleanings = cfg.inference, cfg.extraction.ontology(), cfg.extraction.gleanings
    roots = source_roots(cfg.sources)
    # A local server is this run's own: when it dies, phase 1 says how and stops asking it.
    client = llm_client(endpoint, base_url, base_urls=[u for u in (base_urls or []) if u] or None,
                        deadline=budget.requests_until(), server_exit=cfg.node.server_exit)
    schema = response_schema(endpoint, ontology)
    chunk_tokens = chunk_size(endpoint, ontology, gleanings)
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
        _log_plan(work, len(load_failures), ontology)
        if work.deleted:
            retract_deleted(store, work.deleted)
        queue, first = pending_first(cfg.state_dir, work.extract)
        if first:
            logger.info("%d documents left pending by the last run's budget go first", first)
        budget.log()
        out = run_batches(queue, cfg.extraction.batch_documents, len(work.extract), partial(
            extract_batch, store=store, client=client, model=endpoint.model,
            chunk_tokens=chunk_tokens, overlap_tokens=endpoint.chunk_overlap_tokens,
            schema=schema, changed=set(work.changed), ontology=ontology, gleanings=gleanings),
            client, budget)
        out.save_pending(cfg.state_dir)
        pruned = prune_orphans(store) if (work.deleted or work.changed) else 0
        graph_stats = store.stats()
        ledger.record(graph_stats, run_id)
        top = store.top_entities(10)
        snapshot = keep_snapshot(snapshot_writer(cfg.graph, store, graph_stats),
                                 cfg.snapshot_root(), graph_stats,
                                 cfg.graph.describe(), keep, cfg.snapshot_gcs_block(), run_id,
                                 changed=wrote)
        if isinstance(snapshot, SnapshotFailed):
            logger.warning("graph snapshot not taken: %s", snapshot.error)
        graph = GraphSummary(location=store.location, description=cfg.graph.describe(),
                             **graph_stats, check=check, snapshot=snapshot)
    fails = Failures.of(docs, load_failures, work.held, out.totals.failed)
    dead_letter = cfg.state_dir / "dead-letter.jsonl"
    append_dead_letters(dead_letter, fails.dead_letters())
    report = extraction_report(docs, load_failures, work, list(roots), out, fails, pruned, graph,
                               dead_letter, ontology, gleanings, started, budget, client.stats())
    publish_report(report.model_dump(mode="json"), top)
    share = cfg.extraction.max_failed_share if max_failed_share is None else max_failed_share
    raise_if_failed(report, out, work, load_failures, fails, share, cfg.state_dir, dead_letter)
    return report


def _log_plan(work: Plan, unreadable: int, ontology: GraphSchema) -> None:
    logger = get_run_logger()
    logger.info("%d to extract, %d unchanged (skipped), %d unchanged since they failed "
                "(held; retry with --retry-failed), %d deleted, %d unreadable",
                len(work.extract), len(work.skipped), len(work.held), len(work.deleted),
                unreadable)
    if work.reasons:
        logger.info("extracted again: %s%s", ", ".join(
            f"{n} for {why}" for why, n in sorted(work.reasons.items())),
            f" (graph schema {ontology.path}, digest {ontology.digest()[:8]}; prompt "
            "and schema digests make the extraction version)"
            if work.reasons.get("extraction version") else "")
