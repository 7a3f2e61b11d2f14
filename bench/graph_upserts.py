"""Batched UNWIND upserts into FalkorDB vs one query per entity.

Target: 20k entities + 20k relationships at ≥ 20k entities/s, ≥ 30× one query per entity.
    python bench/graph_upserts.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from _common import report

from tasks.graph import falkordb_server, queries
from tasks.graph.backends import FalkorDBStore
from tasks.graph.store import EntityRow, GraphBatch, RelRow

N = 20_000
SINGLE_SAMPLE = 1_000


def batch(n: int, prefix: str) -> GraphBatch:
    b = GraphBatch(documents=[{"id": f"{prefix}-doc", "stream": "t", "path": "/x"}])
    for i in range(n):
        b.entities[f"Person:{prefix}{i}"] = EntityRow(f"Person:{prefix}{i}", "Person",
                                                      f"P {i}", [f"Mr. P {i}"], "bench")
    for i in range(n):
        b.add_relationship(RelRow(f"Person:{prefix}{i}", "RELATED_TO",
                                  f"Person:{prefix}{(i * 7 + 1) % n}", [f"{prefix}-doc"]))
    return b


def main() -> None:
    data = Path(tempfile.mkdtemp())
    rec, _ = falkordb_server.start(data)
    try:
        store = FalkorDBStore("127.0.0.1", rec.port, "bench", batch_size=1000)
        store.ensure_schema()
        b = batch(N, "b")
        t = time.perf_counter()
        store._write_batched(queries.upsert_entities("Person"),
                             [e.__dict__ for e in b.entities.values()], now="t")
        ent_s = time.perf_counter() - t
        rels = [{"src": r.src, "dst": r.dst, "doc_ids": r.doc_ids, "description": ""}
                for r in b.relationships.values()]
        t = time.perf_counter()
        store._write_batched(queries.upsert_relationships("RELATED_TO"), rels, now="t")
        rel_s = time.perf_counter() - t
        t = time.perf_counter()
        store._write_batched(queries.upsert_entities("Person"),
                             [e.__dict__ for e in b.entities.values()], now="t2")
        remerge_s = time.perf_counter() - t

        single = FalkorDBStore("127.0.0.1", rec.port, "bench_single", batch_size=1)
        single.ensure_schema()
        rows = [e.__dict__ for e in batch(SINGLE_SAMPLE, "s").entities.values()]
        t = time.perf_counter()
        single._write_batched(queries.upsert_entities("Person"), rows, now="t")
        single_rate = SINGLE_SAMPLE / (time.perf_counter() - t)
        counts = store.stats()
    finally:
        falkordb_server.stop(data)
    ent_rate = N / ent_s
    report({"bench": "graph_upserts", "entities": N, "relationships": N,
            "entity_seconds": round(ent_s, 3), "relationship_seconds": round(rel_s, 3),
            "remerge_seconds": round(remerge_s, 3),
            "entities_per_s": round(ent_rate), "relationships_per_s": round(N / rel_s),
            "single_query_entities_per_s": round(single_rate),
            "speedup_vs_single": round(ent_rate / single_rate, 1),
            "graph": counts,
            "targets": {"entities_per_s": ">= 20000", "speedup_vs_single": ">= 30"}})


if __name__ == "__main__":
    main()
