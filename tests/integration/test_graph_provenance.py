"""Chunk-level provenance on a real FalkorDB: the text behind each fact, kept exact through
re-extraction and deletion (issue 24, item 4)."""

from __future__ import annotations

from typing import Any

import pytest

from tasks.graph.store import ChunkRow, EntityRow, GraphBatch, GraphStore, RelRow

ANN, BOB, ACME, MEETING = "Person:ann lee", "Person:bob stone", "Organization:acme", "Event:m1"
A, B = "research/a.md", "research/b.md"
A_V1 = ["Ann Lee works for Acme.", "Bob Stone of Acme met Ann Lee.", "Adjourned."]
A_V2 = ["Acme hired Bob Stone.", "Ann Lee joined later."]
B_V1 = ["Bob Stone works for Acme."]


def add_document(b: GraphBatch, doc: str, pieces: list[str]) -> list[ChunkRow]:
    """The document's text is its pieces joined by spaces; one chunk a piece."""
    b.documents.append({"id": doc, "stream": "research", "path": f"/{doc}"})
    text, rows, at = " ".join(pieces), [], 0
    for i, piece in enumerate(pieces):
        start = text.index(piece, at)
        at = start + len(piece)
        rows.append(ChunkRow(f"{doc}#{i}", doc, i, start, at, piece))
        b.add_chunk(rows[-1])
    return rows


def person(key: str) -> EntityRow:
    return EntityRow(key, "Person", key.split(":")[1].title())


def acme() -> EntityRow:
    return EntityRow(ACME, "Organization", "Acme")


def batch_a_v1() -> GraphBatch:
    b = GraphBatch()
    add_document(b, A, A_V1)
    b.add_entity(EntityRow(MEETING, "Event", "Meeting 1"), A)  # front matter: no chunk
    b.add_entity(person(ANN), A, 0)
    b.add_entity(acme(), A, 0)
    b.add_relationship(RelRow(ANN, "WORKS_FOR", ACME, [A], chunks=[f"{A}#0"]))
    b.add_entity(person(BOB), A, 1)
    b.add_entity(acme(), A, 1)
    b.add_entity(person(ANN), A, 1)
    b.add_relationship(RelRow(BOB, "WORKS_FOR", ACME, [A], chunks=[f"{A}#1"]))
    b.add_relationship(RelRow(BOB, "PARTICIPATED_IN", MEETING, [A]))  # deterministic
    b.add_entity(person(BOB), A)
    return b


def batch_a_v2() -> GraphBatch:
    b = GraphBatch()
    add_document(b, A, A_V2)
    b.add_entity(acme(), A, 0)
    b.add_entity(person(BOB), A, 0)
    b.add_relationship(RelRow(BOB, "WORKS_FOR", ACME, [A], chunks=[f"{A}#0"]))
    b.add_entity(person(ANN), A, 1)
    return b


def batch_b() -> GraphBatch:
    b = GraphBatch()
    add_document(b, B, B_V1)
    b.add_entity(person(BOB), B, 0)
    b.add_entity(acme(), B, 0)
    b.add_relationship(RelRow(BOB, "WORKS_FOR", ACME, [B], chunks=[f"{B}#0"]))
    return b


def row(doc: str, pieces: list[str], i: int) -> dict[str, Any]:
    text = " ".join(pieces)
    start = text.index(pieces[i], sum(len(p) + 1 for p in pieces[:i]))
    return {"document": doc, "path": f"/{doc}", "chunk": i, "start": start,
            "end": start + len(pieces[i]), "text": pieces[i]}


def mentions(store: GraphStore) -> dict[tuple[str, str], list[int]]:
    return {(r["key"], r["doc"]): r["chunks"] for r in store.query(
        "MATCH (e:Entity)-[m:MENTIONED_IN]->(d:Document) "
        "RETURN e.key AS key, d.id AS doc, m.chunks AS chunks")}


def rel_chunks(store: GraphStore) -> dict[tuple[str, str, str], list[str]]:
    return {(r["src"], r["type"], r["dst"]): r["chunks"] for r in store.query(
        "MATCH (a:Entity)-[r]->(b:Entity) "
        "RETURN a.key AS src, type(r) AS type, b.key AS dst, r.chunks AS chunks")}


def chunk_nodes(store: GraphStore) -> dict[str, str]:
    return {r["id"]: r["text"] for r in store.query(
        "MATCH (c:Chunk)-[:CHUNK_OF]->(:Document) RETURN c.id AS id, c.text AS text")}


def test_evidence_is_the_text_of_the_chunks_behind_each_fact(store: GraphStore) -> None:
    store.upsert(batch_a_v1())
    store.upsert(batch_b())
    assert store.evidence(ANN) == [row(A, A_V1, 0), row(A, A_V1, 1)]
    assert store.evidence(ACME) == [row(A, A_V1, 0), row(A, A_V1, 1), row(B, B_V1, 0)]
    assert store.evidence(BOB) == [row(A, A_V1, 1), row(B, B_V1, 0)]
    assert store.evidence(MEETING) == []  # front matter: no chunk carries it
    assert store.relationship_evidence(BOB, "WORKS_FOR", ACME) == [row(A, A_V1, 1),
                                                                   row(B, B_V1, 0)]
    assert store.relationship_evidence(ANN, "WORKS_FOR", ACME) == [row(A, A_V1, 0)]
    assert store.relationship_evidence(BOB, "PARTICIPATED_IN", MEETING) == []
    assert store.evidence("Person:nobody") == []
    # the spans are offsets into the document's text
    text = " ".join(A_V1)
    assert all(text[r["start"]:r["end"]] == r["text"] for r in store.evidence(ANN))
    assert mentions(store) == {(MEETING, A): [], (ANN, A): [0, 1], (ACME, A): [0, 1],
                               (BOB, A): [1], (BOB, B): [0], (ACME, B): [0]}
    assert rel_chunks(store) == {(ANN, "WORKS_FOR", ACME): [f"{A}#0"],
                                 (BOB, "WORKS_FOR", ACME): [f"{A}#1", f"{B}#0"],
                                 (BOB, "PARTICIPATED_IN", MEETING): []}
    s = store.stats()
    assert s["nodes"]["Chunk"] == 4 and s["relationships"]["CHUNK_OF"] == 4


def test_re_extraction_leaves_only_the_new_provenance(store: GraphStore) -> None:
    store.upsert(batch_a_v1())
    store.upsert(batch_b())
    store.retract([A])  # A changed: what it said goes before its new extraction lands
    store.upsert(batch_a_v2())
    assert store.evidence(ANN) == [row(A, A_V2, 1)]
    assert store.evidence(BOB) == [row(A, A_V2, 0), row(B, B_V1, 0)]
    assert store.relationship_evidence(BOB, "WORKS_FOR", ACME) == [row(A, A_V2, 0),
                                                                   row(B, B_V1, 0)]
    assert mentions(store) == {(ANN, A): [1], (ACME, A): [0], (BOB, A): [0],
                               (BOB, B): [0], (ACME, B): [0]}
    # Ann WORKS_FOR Acme had only A's old chunk 0: gone with it
    assert rel_chunks(store) == {(BOB, "WORKS_FOR", ACME): [f"{B}#0", f"{A}#0"]}
    assert chunk_nodes(store) == {f"{A}#0": A_V2[0], f"{A}#1": A_V2[1], f"{B}#0": B_V1[0]}
    assert store.query("MATCH (c:Chunk {document: $d}) RETURN count(c) AS n",
                       {"d": A}) == [{"n": 2}]
    assert store.prune_orphans() == 1  # the meeting: A's new version has no front matter


def test_a_deleted_document_takes_its_chunks_and_keeps_the_others(store: GraphStore) -> None:
    store.upsert(batch_a_v1())
    store.upsert(batch_b())
    store.retract([A], delete=True)
    assert chunk_nodes(store) == {f"{B}#0": B_V1[0]}
    assert store.query("MATCH (c:Chunk) RETURN count(c) AS n") == [{"n": 1}]
    assert rel_chunks(store) == {(BOB, "WORKS_FOR", ACME): [f"{B}#0"]}
    assert store.relationship_evidence(BOB, "WORKS_FOR", ACME) == [row(B, B_V1, 0)]
    assert store.evidence(ANN) == [] and store.evidence(ACME) == [row(B, B_V1, 0)]
    assert store.prune_orphans() == 2  # Ann and the meeting
    assert store.stats() == {"nodes": {"Chunk": 1, "Document": 1, "Entity": 2,
                                       "Organization": 1, "Person": 1},
                             "relationships": {"CHUNK_OF": 1, "MENTIONED_IN": 2,
                                               "WORKS_FOR": 1}}


def test_the_same_batch_twice_gives_the_same_provenance(store: GraphStore) -> None:
    store.upsert(batch_a_v1())
    store.upsert(batch_b())
    once = (mentions(store), rel_chunks(store), chunk_nodes(store), store.stats())
    store.upsert(batch_a_v1())  # ON MATCH: chunk lists merged, never doubled
    store.upsert(batch_b())
    assert (mentions(store), rel_chunks(store), chunk_nodes(store), store.stats()) == once


def test_a_document_named_like_a_chunk_keeps_its_chunks(store: GraphStore) -> None:
    """Retracting "x" must not take the chunks of a document called "x#1.md"."""
    b = GraphBatch()
    for doc in ("x", "x#1.md"):
        add_document(b, doc, ["Bob Stone works for Acme."])
        b.add_entity(person(BOB), doc, 0)
        b.add_entity(acme(), doc, 0)
        b.add_relationship(RelRow(BOB, "WORKS_FOR", ACME, [doc], chunks=[f"{doc}#0"]))
    store.upsert(b)
    store.retract(["x"], delete=True)
    assert rel_chunks(store) == {(BOB, "WORKS_FOR", ACME): ["x#1.md#0"]}
    assert chunk_nodes(store) == {"x#1.md#0": "Bob Stone works for Acme."}


def test_a_graph_written_before_chunks_gains_them(store: GraphStore) -> None:
    """Edges written before this change have no `chunks`; upsert and retract read it as []."""
    store.upsert(batch_b())
    store._write("MATCH ()-[r]->() SET r.chunks = NULL")
    store._write("MATCH (c:Chunk) DETACH DELETE c")
    assert set(rel_chunks(store).values()) == {None}
    store.upsert(batch_b())
    assert rel_chunks(store) == {(BOB, "WORKS_FOR", ACME): [f"{B}#0"]}
    assert mentions(store) == {(BOB, B): [0], (ACME, B): [0]}
    store._write("MATCH ()-[r]->() SET r.chunks = NULL")
    store.retract([B])
    assert rel_chunks(store) == {} and mentions(store) == {} and chunk_nodes(store) == {}


def test_relationship_evidence_checks_the_type(store: GraphStore) -> None:
    with pytest.raises(ValueError, match="not an identifier"):
        store.relationship_evidence(BOB, "WORKS_FOR]->() DETACH DELETE (n", ACME)
    with pytest.raises(ValueError, match="reserved"):
        store.relationship_evidence(BOB, "MENTIONED_IN", ACME)
