"""Phase 1 as a flow: the day's documents → LLM → property graph.

Runs inside the nightly flow, or on its own against a running endpoint:
    prefect deployment run 'extract/ad-hoc' -p base_url=http://127.0.0.1:8080
"""

from __future__ import annotations

import time

from prefect import flow, get_run_logger
from prefect.runtime import flow_run as current_run

from tasks.extraction.plan import Reextract, plan
from tasks.extraction.run import (
    Budget,
    Phase1Run,
    begin_writes,
    check_graph,
    extraction_report,
    graph_summary,
    log_plan,
    raise_if_failed,
    run_batches,
)
from tasks.extraction.stages import prune_orphans, publish_report, scan_documents
from tasks.graph.open import open_graph
from tasks.profile import load_profile
from tasks.records import ExtractionReport


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
    started = time.monotonic()
    budget = Budget.of(deadline, budget_seconds)
    setup = load_profile(profile).phase1(profile, max_failed_share)
    # A local server is this run's own: when it dies, phase 1 says how and stops asking it.
    client = setup.client(base_url, base_urls, budget.requests_until())
    run_id = current_run.get_id()
    with open_graph(setup.graph, progress=get_run_logger()) as store:
        check = check_graph(setup, store, full)
        docs, load_failures = scan_documents(setup.roots, setup.max_bytes)
        work = plan(docs, load_failures, store.document_states(), setup.ask, setup.roots,
                    Reextract(full, retry_failed))
        log_plan(work, len(load_failures), setup.ask.ontology)
        begin_writes(setup, store, work, run_id)
        out = run_batches(setup, store, client, work, budget)
        pruned = prune_orphans(store) if (work.deleted or work.changed) else 0
        graph, top = graph_summary(setup, store, work, check, run_id)
    run = Phase1Run(docs, load_failures, work, out, pruned, graph, budget, started)
    report = extraction_report(setup, run, client.stats())
    publish_report(report, top)
    raise_if_failed(setup, run, report)
    return report
