import time

import pytest

from tasks.graph.falkordb_store import FalkorDBStore
from tasks.graph.store import EntityRow, GraphBatch, GraphStore
from tasks.shared.errors import GraphError
from tests.support.graph_batches import batch_for, mark
from tests.support.graph_dump import dump


def test_upsert_is_idempotent_and_batched(store: GraphStore) -> None:
    b = batch_for("d1", [f"P{i}" for i in range(23)])  # > batch_size 7: several transactions
    store.upsert(b)
    first = dump(store)
    store.upsert(b)
    assert dump(store) == first
    s = store.stats()
    assert s["nodes"]["Person"] == 23 and s["nodes"]["Organization"] == 1
    assert s["relationships"] == {"MENTIONED_IN": 24, "WORKS_FOR": 23}


def test_provenance_is_shared_and_retracted_per_document(store: GraphStore) -> None:
    store.upsert(batch_for("d1", ["Ann", "Bob"]))
    store.upsert(batch_for("d2", ["Bob", "Cy"]))
    mark(store, "d1", "d2")
    rels = {r["p"]: sorted(r["docs"]) for r in store.query(
        "MATCH (p:Person)-[r:WORKS_FOR]->() RETURN p.name AS p, r.doc_ids AS docs")}
    assert rels == {"Ann": ["d1"], "Bob": ["d1", "d2"], "Cy": ["d2"]}

    store.retract(["d1"])  # d1 changed: its contribution goes, d2's stays
    rels = {r["p"]: r["docs"] for r in store.query(
        "MATCH (p:Person)-[r:WORKS_FOR]->() RETURN p.name AS p, r.doc_ids AS docs")}
    assert rels == {"Bob": ["d2"], "Cy": ["d2"]}
    assert store.document_states()["d1"]["hash"] is None
    assert store.prune_orphans() == 1  # Ann: mentioned nowhere now
    store.retract(["d2"], delete=True)
    assert store.prune_orphans() == 3
    assert store.stats() == {"nodes": {"Document": 1}, "relationships": {}}


@pytest.mark.parametrize("evil", [
    "x'}) MATCH (n) DETACH DELETE n //",
    'x"}) DETACH DELETE e //',
    "Robert`) DETACH DELETE (n",
    "$rows {key: 'p'}",
])
def test_cypher_injection_in_names_is_stored_as_data(store: GraphStore, evil: str) -> None:
    store.upsert(batch_for("d1", ["Ann"]))
    b = batch_for("d2", [evil])
    store.upsert(b)
    names = {r["n"] for r in store.query("MATCH (p:Person) RETURN p.name AS n")}
    assert names == {"Ann", evil}
    assert store.stats()["nodes"]["Document"] == 2


def test_email_lookup(store: GraphStore) -> None:
    b = GraphBatch(documents=[{"id": "c", "stream": "contacts", "path": "/c"}])
    b.add_entity(EntityRow("Person:ann lee", "Person", "Ann Lee", emails=["ann@x.org"]), "c")
    store.upsert(b)
    assert store.keys_by_email(["ann@x.org", "nobody@x.org"]) == {"ann@x.org": "Person:ann lee"}


def test_unique_key_constraints_are_enforced(store: GraphStore) -> None:
    if isinstance(store, FalkorDBStore):  # FalkorDB builds them in the background
        for _ in range(100):
            states = {(c["label"], c["status"]) for c in store._graph.list_constraints()}
            if states == {("Entity", "OPERATIONAL"), ("Document", "OPERATIONAL")}:
                break
            time.sleep(0.05)
    store._write("CREATE (:Entity {key: 'dup'})")
    with pytest.raises(GraphError, match="(?i)constraint|already exists"):
        store._write("CREATE (:Entity {key: 'dup'})")


@pytest.mark.parametrize(("field", "value", "why"), [
    ("emails", ["ann@x.org", None], "field emails holds a null at index 1"),
    ("aliases", ["Ann", 3], "field aliases mixes types"),
    ("aliases", [["Ann"]], "field aliases holds a list at index 0"),
    ("description", {"text": "x"}, "field description is a map"),
    ("properties", {"role": None}, "field properties.role is null"),
    ("properties", {"role": {"a": 1}}, "field properties.role is a map"),
])
def test_a_row_neither_store_keeps_fails_the_batch_before_any_write(
        store: GraphStore, field: str, value: object, why: str) -> None:
    """Neo4j refuses nulls inside lists, mixed lists and maps, and SET += drops a null property;
    FalkorDB stores them all. Both stores check every row first and name it."""
    b = batch_for("d1", ["Ann", "Bob"])
    bad = b.entities["Person:bob"]
    setattr(bad, field, value)
    with pytest.raises(GraphError) as err:
        store.upsert(b)
    assert str(err.value).startswith(f"entity 'Person:bob': {why}")
    assert store.stats() == {"nodes": {}, "relationships": {}}  # nothing of the batch


def test_schema_properties_are_stored_and_merged(store: GraphStore) -> None:
    b = GraphBatch(documents=[{"id": "d1", "stream": "t", "path": "/d1"}])
    b.add_entity(EntityRow("Person:ann lee", "Person", "Ann Lee", properties={"role": "chair"}),
                 "d1")
    b.add_entity(EntityRow("Person:bob stone", "Person", "Bob Stone"), "d1")  # none
    store.upsert(b)
    b2 = GraphBatch(documents=[{"id": "d2", "stream": "t", "path": "/d2"}])
    b2.add_entity(EntityRow("Person:ann lee", "Person", "Ann Lee",
                            properties={"riding": "Oakville"}), "d2")
    store.upsert(b2)
    rows = store.query("MATCH (p:Person) RETURN p.name AS n, p.role AS role, "
                       "p.riding AS riding ORDER BY n")
    assert rows == [{"n": "Ann Lee", "role": "chair", "riding": "Oakville"},
                    {"n": "Bob Stone", "role": None, "riding": None}]
