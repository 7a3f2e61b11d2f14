"""Batched UNWIND upserts on both stores in one run: the embedded FalkorDB (the baseline) and
Neo4j Community 5.26 (tasks/graph/neo4j_local.py), at 100k entities and 100k relationships.

Per store: opening it (connect + schema), the row checks, entity and relationship upserts, a
re-merge of every entity (the ON MATCH path), stats(), one query per entity (a 1,000-row
sample: what batching saves), and, for Neo4j, the logical snapshot: export, replay into the
emptied database, and whether the replayed graph equals the original with every property's
type. Prints ratios Neo4j / FalkorDB.

    python bench/graph_upserts.py [N]      # N entities (default 100000)
"""

from __future__ import annotations

import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import report

from tasks.graph import falkordb_server, neo4j_local, queries
from tasks.graph.export import export, replay
from tasks.graph.falkordb_store import FalkorDBStore
from tasks.graph.neo4j_store import Neo4jStore
from tasks.graph.store import EntityRow, GraphStore, RelRow, check_row

SINGLE_SAMPLE = 1_000


def rows(n: int, prefix: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ents = [EntityRow(f"Person:{prefix}{i}", "Person", f"P {i}", [f"Mr. P {i}"], "bench",
                      emails=[f"p{i}@x.org"], properties={"riding": f"R{i % 300}"}).__dict__
            for i in range(n)]
    rels = [RelRow(f"Person:{prefix}{i}", "RELATED_TO", f"Person:{prefix}{(i * 7 + 1) % n}",
                   [f"{prefix}-doc"], "knows").__dict__ for i in range(n)]
    return ents, [{k: r[k] for k in ("src", "dst", "doc_ids", "chunks", "description")}
                  for r in rels]


def timed(fn: Any, *args: Any, **kw: Any) -> float:
    t = time.perf_counter()
    fn(*args, **kw)
    return time.perf_counter() - t


def typed(store: GraphStore) -> list[Any]:
    nodes = sorted((tuple(sorted(r["l"])), sorted((k, type(v).__name__, repr(v))
                                                   for k, v in r["p"].items()))
                   for r in store.query("MATCH (n) RETURN labels(n) AS l, properties(n) AS p"))
    rels = sorted((r["t"], r["a"], r["b"], sorted((k, type(v).__name__, repr(v))
                                                  for k, v in r["p"].items()))
                  for r in store.query("MATCH (a)-[r]->(b) RETURN type(r) AS t, a.key AS a, "
                                       "b.key AS b, properties(r) AS p"))
    return [nodes, rels]


def measure(store: GraphStore, single: GraphStore, n: int) -> dict[str, Any]:
    ents, rels = rows(n, "b")
    out: dict[str, Any] = {}
    out["row_check_s"] = timed(lambda: [check_row("r", r, ("properties",)) for r in ents])
    out["entity_s"] = timed(store._write_batched, queries.upsert_entities("Person"), ents,
                            checked=True, now="t")
    out["relationship_s"] = timed(store._write_batched, queries.upsert_relationships(
        "RELATED_TO"), rels, checked=True, now="t")
    out["remerge_s"] = timed(store._write_batched, queries.upsert_entities("Person"), ents,
                             checked=True, now="t2")
    t = time.perf_counter()
    out["graph"] = store.stats()
    out["stats_s"] = time.perf_counter() - t
    sample = rows(SINGLE_SAMPLE, "s")[0]
    single_s = timed(single._write_batched, queries.upsert_entities("Person"), sample,
                     checked=True, now="t")
    out["entities_per_s"] = n / out["entity_s"]
    out["relationships_per_s"] = n / out["relationship_s"]
    out["single_query_entities_per_s"] = SINGLE_SAMPLE / single_s
    out["speedup_vs_single"] = out["entities_per_s"] / out["single_query_entities_per_s"]
    return out


def falkordb(n: int) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp())
    t = time.perf_counter()
    rec, _ = falkordb_server.start(data)
    try:
        store = FalkorDBStore("127.0.0.1", rec.port, "bench", batch_size=1000)
        store.ensure_schema()
        opened = time.perf_counter() - t
        single = FalkorDBStore("127.0.0.1", rec.port, "bench_single", batch_size=1)
        single.ensure_schema()
        return {"open_s": opened, **measure(store, single, n)}
    finally:
        falkordb_server.stop(data)


def neo4j(n: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp())
    t = time.perf_counter()
    with neo4j_local.running(secrets.token_urlsafe(12), work, heap="2g") as server:
        started = time.perf_counter() - t
        t = time.perf_counter()
        store = Neo4jStore(server.uri, server.user, server.password, batch_size=1000)
        store.ensure_schema()
        opened = time.perf_counter() - t
        single = Neo4jStore(server.uri, server.user, server.password, batch_size=1)
        out = {"server_start_s": started, "open_s": opened, **measure(store, single, n)}
        before = typed(store)
        snap = work / "graph.jsonl.gz"
        t = time.perf_counter()
        counts = export(store, snap)
        out["export_s"] = time.perf_counter() - t
        out["export_mb"] = snap.stat().st_size / 1e6
        t = time.perf_counter()
        store.clear()
        out["clear_s"] = time.perf_counter() - t
        t = time.perf_counter()
        replay(store, snap)
        out["replay_s"] = time.perf_counter() - t
        out["restored_equals_original"] = typed(store) == before and store.stats() == counts
        store.close()
        single.close()
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    f, g = falkordb(n), neo4j(n)
    keys = ("open_s", "row_check_s", "entity_s", "relationship_s", "remerge_s", "stats_s",
            "entities_per_s", "relationships_per_s", "single_query_entities_per_s")
    report({"bench": "graph_upserts", "entities": n, "relationships": n,
            "falkordb": {k: round(v, 3) if isinstance(v, float) else v for k, v in f.items()},
            "neo4j": {k: round(v, 3) if isinstance(v, float) else v for k, v in g.items()},
            "neo4j_over_falkordb": {k: round(g[k] / f[k], 2) for k in keys if f[k]}})


if __name__ == "__main__":
    main()
