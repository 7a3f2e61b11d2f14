"""A canonical, timestamp-free dump of a graph, to compare two graphs."""

from typing import Any

from tasks.graph.store import GraphStore


def dump(store: GraphStore) -> dict[str, Any]:
    nodes = store.query(
        "MATCH (n) RETURN labels(n) AS labels, n.key AS key, n.id AS id, n.name AS name, "
        "n.aliases AS aliases, n.emails AS emails, n.hash AS hash")
    rels = store.query(
        "MATCH (a)-[r]->(b) RETURN type(r) AS type, coalesce(a.key, a.id) AS src, "
        "coalesce(b.key, b.id) AS dst, r.doc_ids AS doc_ids")
    norm_nodes = sorted((sorted(n["labels"]), n["key"] or "", n["id"] or "", n["name"] or "",
                         sorted(n["aliases"] or []), sorted(n["emails"] or []), n["hash"] or "")
                        for n in nodes)
    norm_rels = sorted((r["type"], r["src"], r["dst"], sorted(r["doc_ids"] or []))
                       for r in rels)
    return {"nodes": norm_nodes, "relationships": norm_rels}
