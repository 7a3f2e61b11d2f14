import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.graph.backends import FalkorDBStore
from tasks.graph.store import EntityRow, GraphBatch
from tests.support.graph_batches import batch_for, mark
from tests.support.graph_dump import dump


def test_upsert_is_idempotent_and_batched(store: FalkorDBStore) -> None:
    b = batch_for("d1", [f"P{i}" for i in range(23)])  # > batch_size 7: several transactions
    store.upsert(b)
    first = dump(store)
    store.upsert(b)
    assert dump(store) == first
    s = store.stats()
    assert s["nodes"]["Person"] == 23 and s["nodes"]["Organization"] == 1
    assert s["relationships"] == {"MENTIONED_IN": 24, "WORKS_FOR": 23}


def test_provenance_is_shared_and_retracted_per_document(store: FalkorDBStore) -> None:
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
def test_cypher_injection_in_names_is_stored_as_data(store: FalkorDBStore, evil: str) -> None:
    store.upsert(batch_for("d1", ["Ann"]))
    b = batch_for("d2", [evil])
    store.upsert(b)
    names = {r["n"] for r in store.query("MATCH (p:Person) RETURN p.name AS n")}
    assert names == {"Ann", evil}
    assert store.stats()["nodes"]["Document"] == 2


def test_email_lookup(store: FalkorDBStore) -> None:
    b = GraphBatch(documents=[{"id": "c", "stream": "contacts", "path": "/c"}])
    b.add_entity(EntityRow("Person:ann lee", "Person", "Ann Lee", emails=["ann@x.org"]), "c")
    store.upsert(b)
    assert store.keys_by_email(["ann@x.org", "nobody@x.org"]) == {"ann@x.org": "Person:ann lee"}


def test_neo4j_driver_over_falkordb_bolt() -> None:
    """Official neo4j driver (5.19) → FalkorDB Bolt, in a private network namespace."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs util-linux unshare and iproute2 (network namespace)")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        ["unshare", "-n", "sh", "-c", f"ip link set lo up && {sys.executable} -m tests.support.bolt_smoke"],
        cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"works_for": 3, "hash": "h", "native_persons": 3, "pruned": 4,
                   "after": {"nodes": {}, "relationships": {}}}


def test_unique_key_constraints_are_enforced(store: FalkorDBStore) -> None:
    from tasks.errors import GraphError

    for _ in range(100):
        states = {(c["label"], c["status"]) for c in store._graph.list_constraints()}
        if states == {("Entity", "OPERATIONAL"), ("Document", "OPERATIONAL")}:
            break
        time.sleep(0.05)
    store._write("CREATE (:Entity {key: 'dup'})")
    with pytest.raises(GraphError, match="constraint"):
        store._write("CREATE (:Entity {key: 'dup'})")


def test_schema_properties_are_stored_and_merged(store: FalkorDBStore) -> None:
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
