"""Prefect's share of phase-1 wall time at 1,000 documents.

The same batches through the extract flow (Prefect tasks, artifacts, progress) and through the
plain functions the tasks call, against the fake endpoint (1 s latency, 32 slots).
Target: overhead ≤ 5% of the flow's wall time.
    python bench/orchestration_overhead.py
"""

from __future__ import annotations

import time

from _common import phase1_setup, profile, report

from flows.extract import extract
from tasks.extraction.batch import process_batch
from tasks.extraction.documents import scan
from tasks.extraction.inputs import llm_client, source_roots
from tasks.extraction.plan import Reextract, plan
from tasks.extraction.setup import ask_for
from tasks.graph.open import open_graph
from tasks.graph.store import batched
from tasks.profile import load_profile

N, LATENCY, SLOTS, BATCH = 1000, 1.0, 32, 256


def plain(prof: str) -> int:
    """Phase 1 without Prefect: the same functions, the same batches."""
    cfg = load_profile(prof)
    ep = cfg.inference
    client = llm_client(ep)
    calls = 0
    with open_graph(cfg.graph) as store:
        docs, failures = scan(source_roots(cfg.sources), 10**7)
        ask = ask_for(ep, cfg.extraction.ontology())
        work = plan(docs, failures, store.document_states(), ask, ["transcripts"], Reextract(True))
        for b in batched(work.extract, BATCH):
            rep = process_batch(list(b), store, client, ask, set(work.changed))
            calls += rep.usage.calls
        store.prune_orphans()
    return calls


def main() -> None:
    with phase1_setup(N, LATENCY) as (tmp, port, url):
        p_flow = str(profile(tmp, url, port, "flow", SLOTS, BATCH))
        p_plain = str(profile(tmp, url, port, "plain", SLOTS, BATCH))
        extract(profile=p_flow)  # warm-up (Prefect server start, imports, first graph)
        plain(p_plain)
        t = time.perf_counter()
        summary = extract(profile=p_flow, full=True)
        flow_s = time.perf_counter() - t
        t = time.perf_counter()
        calls = plain(p_plain)
        plain_s = time.perf_counter() - t
    assert summary.llm_calls == calls == N
    report({"bench": "orchestration_overhead", "documents": N, "batch_documents": BATCH,
            "flow_s": round(flow_s, 2), "plain_s": round(plain_s, 2),
            "overhead_s": round(flow_s - plain_s, 2),
            "overhead_share": round((flow_s - plain_s) / flow_s, 4),
            "targets": {"overhead_share": "<= 0.05"}})


if __name__ == "__main__":
    main()
