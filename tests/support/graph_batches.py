"""Graph batches and extraction marks the graph-store tests write."""

from tasks.graph.store import EntityRow, GraphBatch, GraphStore, RelRow


def batch_for(doc: str, people: list[str], org: str = "Acme") -> GraphBatch:
    b = GraphBatch(documents=[{"id": doc, "stream": "t", "path": f"/{doc}"}])
    o = EntityRow(f"Organization:{org.lower()}", "Organization", org)
    b.add_entity(o, doc)
    for p in people:
        e = EntityRow(f"Person:{p.lower()}", "Person", p, aliases=[f"Hon. {p}"], emails=[])
        b.add_entity(e, doc)
        b.add_relationship(RelRow(e.key, "WORKS_FOR", o.key, [doc], "staff"))
    return b


def mark(store: GraphStore, *docs: str) -> None:
    store.mark_extracted([{"id": d, "hash": "h", "model": "m", "prompt_version": "p",
                           "extracted_at": "t"} for d in docs])
