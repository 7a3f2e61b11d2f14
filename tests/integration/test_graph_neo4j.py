"""What only a real Neo4j shows (Community 5.26, tasks/graph/neo4j_local.py): the schema judged
by the server's error codes and SHOW CONSTRAINTS, the transaction memory cap, authentication,
bookmarks, and the preflight's schema check. The tests every store passes are parametrized over
both in test_graph_store.py, test_graph_provenance.py and test_extract_flow.py.

Community cannot show: a missing CREATE CONSTRAINT privilege (it has no roles; the message for
Neo.ClientError.Security.Forbidden is read from the code, not run), a cluster's stale reads
(one member: the shared bookmark manager is checked to collect the server's bookmarks), or
another database than `neo4j`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from blocks.graph import Neo4jGraph
from tasks.graph.neo4j_local import VERSION, LocalNeo4j
from tasks.graph.neo4j_store import Neo4jStore
from tasks.graph.store import ChunkRow, GraphBatch
from tasks.preflight.orchestrator import schema_check
from tasks.shared.errors import GraphError
from tests.fakes.openai_server import FakeOpenAI
from tests.support.documents import transcript
from tests.support.neo4j import empty_neo4j
from tests.support.profiles import extraction_profile
from tests.support.worker_node import harness_api_url

SLM = str(Path(sys.executable).parent / "slm-nightly")


@pytest.fixture
def bare(neo4j_server: LocalNeo4j) -> Iterator[Neo4jStore]:
    """An empty graph with no constraints and no indexes (as a new database is)."""
    store = empty_neo4j(neo4j_server, schema=False)
    yield store
    store.close()


def test_ensure_schema_creates_the_four_constraints_and_is_idempotent(bare: Neo4jStore) -> None:
    assert bare.missing_keys() == ["Entity.key", "Document.id", "Chunk.id", "Split.id"]
    bare.ensure_schema()
    bare.ensure_schema()  # IF NOT EXISTS: no error the second time
    assert bare.missing_keys() == []
    rows = bare._read("SHOW CONSTRAINTS YIELD name, type RETURN name, type ORDER BY name")
    assert rows == [{"name": "chunk_id", "type": "UNIQUENESS"},
                    {"name": "document_id", "type": "UNIQUENESS"},
                    {"name": "entity_key", "type": "UNIQUENESS"},
                    {"name": "split_id", "type": "UNIQUENESS"}]


def test_an_index_in_the_way_fails_loudly_and_names_the_fix(bare: Neo4jStore) -> None:
    """Neo4j: "There already exists an index (:Entity {key}). A constraint cannot be created
    until the index has been dropped." — an error with "already" in it, which the old check
    took for "done", leaving MERGE unindexed and racy."""
    bare._write("CREATE INDEX old_key FOR (e:Entity) ON (e.key)")
    with pytest.raises(GraphError) as err:
        bare.ensure_schema()
    assert "Neo4j refused the unique constraint entity_key on :Entity(key)" in str(err.value)
    assert "run `DROP INDEX old_key` and run again" in str(err.value)
    assert bare.missing_keys() == ["Entity.key", "Document.id", "Chunk.id", "Split.id"]


def test_a_same_named_constraint_of_another_shape_is_not_taken_for_ours(bare: Neo4jStore) -> None:
    """IF NOT EXISTS matches by name: `entity_key` on Entity.name makes our statement a silent
    no-op, so SHOW CONSTRAINTS decides."""
    bare._write("CREATE CONSTRAINT entity_key FOR (e:Entity) REQUIRE e.name IS UNIQUE")
    with pytest.raises(GraphError, match=r"no unique constraint on Entity\.key after creating "
                       r"them \(constraints present: \['chunk_id', 'document_id', "
                       r"'entity_key', 'split_id'\]\) — a constraint named like ours"):
        bare.ensure_schema()


def test_duplicate_keys_are_named_when_the_constraint_cannot_be_made(bare: Neo4jStore) -> None:
    bare._write("CREATE (:Entity {key: 'Person:ann'}), (:Entity {key: 'Person:ann'}), "
                "(:Entity {key: 'Person:bob'})")
    with pytest.raises(GraphError, match=r"these key values are held by more than one :Entity: "
                       r"'Person:ann' \(2 nodes\); merge or delete the duplicates"):
        bare.ensure_schema()


def test_preflight_creates_missing_constraints_or_says_why_it_cannot(bare: Neo4jStore) -> None:
    where = "Neo4j at test"
    bare._write("CREATE INDEX old_key FOR (e:Entity) ON (e.key)")
    check = schema_check(bare, where)
    assert check is not None and check.status == "failed"
    assert check.detail.startswith("Neo4j at test: no unique constraint on Entity.key, "
                                   "Document.id, Chunk.id, Split.id, and creating it failed: ")
    assert "DROP INDEX old_key" in check.detail
    bare._write("DROP INDEX old_key")
    check = schema_check(bare, where)
    assert check is not None and (check.status, check.detail) == (
        "ok", "Neo4j at test: created the unique constraints on Entity.key, Document.id, "
        "Chunk.id, Split.id")
    check = schema_check(bare, where)
    assert check is not None and check.detail == (
        "Neo4j at test: unique constraints on Entity.key, Document.id, Chunk.id and Split.id")


def _long_chunks(n: int, size: int) -> GraphBatch:
    b = GraphBatch(documents=[{"id": "d", "stream": "t", "path": "/d"}])
    for i in range(n):
        b.add_chunk(ChunkRow(f"d#{i}", "d", i, i * size, (i + 1) * size, chr(65 + i % 26) * size))
    return b


def test_transactions_are_bounded_by_bytes_and_running_out_of_memory_is_not_retried(
        neo4j_server: LocalNeo4j) -> None:
    """The test server caps a transaction at 64 MiB (conftest NEO4J_SETTINGS). 300 chunks of
    100 kB is one statement of 300 rows under batch_size 1000: over the cap (the memory error
    is transient, which the driver's managed transactions would retry for 30 s). batch_bytes
    (8 MiB) cuts it into 4 transactions, and retraction and clear() delete the chunks as
    bounded."""
    store = empty_neo4j(neo4j_server, batch_size=1000)
    batch = _long_chunks(300, 100_000)
    store.batch_bytes = 1 << 40  # rows only, as before
    t = time.monotonic()
    with pytest.raises(GraphError, match=r"Neo4j ran out of transaction memory \(Neo\."
                       r"TransientError\.General\.MemoryPoolOutOfMemoryError\) on a statement "
                       r"of 300 row\(s\) — lower the graph block's batch_bytes"):
        store.upsert(batch)
    assert time.monotonic() - t < 15  # said at once, not after 30 s of retries
    store.batch_bytes = Neo4jGraph().batch_bytes
    store.upsert(batch)
    assert store.stats()["nodes"] == {"Chunk": 300, "Document": 1}
    assert store.query("MATCH (c:Chunk {id: 'd#299'}) RETURN size(c.text) AS n") == [{"n": 100_000}]
    store.retract(["d"])
    assert store.stats() == {"nodes": {"Document": 1}, "relationships": {}}
    store.upsert(batch)
    store.clear()
    assert store.stats() == {"nodes": {}, "relationships": {}}
    store.close()


def test_a_wrong_password_names_the_server_and_user_never_the_password(
        neo4j_server: LocalNeo4j) -> None:
    wrong = neo4j_server.password + "-wrong"
    with pytest.raises(GraphError) as err:
        Neo4jStore(neo4j_server.uri, "neo4j", wrong)
    assert str(err.value) == (f"cannot connect to Neo4j at {neo4j_server.uri} as 'neo4j': "
                              "Neo.ClientError.Security.Unauthorized — check the graph block's "
                              "uri, user and password")
    assert wrong not in repr(err.value.__cause__)


def test_every_statement_of_a_store_shares_its_bookmarks(neo4j_server: LocalNeo4j) -> None:
    """The server hands a bookmark back for each write; the store's one bookmark manager keeps
    it for its next session (on a cluster, the member that answers waits until it has it)."""
    store = empty_neo4j(neo4j_server)
    before = set(store._bookmarks.get_bookmarks())
    store._write("CREATE (:Document {id: 'x'})")
    after = set(store._bookmarks.get_bookmarks())
    assert after and after != before
    assert store.query("MATCH (d:Document) RETURN d.id AS id") == [{"id": "x"}]
    store.close()


def test_the_block_names_its_database_and_defaults_to_tls_routing() -> None:
    block = Neo4jGraph()
    assert (block.uri, block.database, block.batch_bytes) == (
        "neo4j+s://localhost:7687", "neo4j", 8 << 20)
    assert Neo4jGraph(database=None).database == "neo4j"  # a block saved before the default


def test_a_routing_driver_is_sent_to_the_servers_advertised_address(
        neo4j_server: LocalNeo4j) -> None:
    """neo4j:// asks the server where to go (its routing table, from
    server.bolt.advertised_address, localhost:7687 by default): the harness advertises the port
    it listens on, so a routing store reaches this server and no other."""
    routed = neo4j_server.uri.replace("bolt://", "neo4j://")
    with Neo4jStore(routed, neo4j_server.user, neo4j_server.password) as store:
        table = store._read("CALL dbms.routing.getRoutingTable({}, 'neo4j') YIELD servers "
                            "RETURN servers")
        addresses = {a for s in table[0]["servers"] for a in s["addresses"]}
        assert addresses == {f"127.0.0.1:{neo4j_server.port}"}
        store._write("CREATE (:Document {id: 'routed'})")
        assert store.query("MATCH (d:Document {id: 'routed'}) RETURN d.id AS id") == [
            {"id": "routed"}]


@pytest.mark.usefixtures("prefect_api")
def test_the_local_neo4j_command_serves_a_phase_1_from_its_own_profile_snippet(
        tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    """`slm-nightly graph local-neo4j` as a user runs it (docs/operations.md): its printed
    [graph] table, pasted into a profile, takes `slm-nightly run --phases extract`; Ctrl-C
    (SIGINT) ends it and its JVM."""
    proc = subprocess.Popen([SLM, "graph", "local-neo4j", "--workdir", str(tmp_path / "n4j"),
                             "--heap", "512m"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C stops it."):
                break
        printed = "".join(lines)
        assert printed.startswith(f"Neo4j Community {VERSION} at bolt://127.0.0.1:"), printed
        table = tomllib.loads(printed[printed.index("[graph]"):printed.index("Ctrl-C")])["graph"]
        assert sorted(table) == ["database", "password", "type", "uri", "user"]
        src = tmp_path / "docs"
        profile = extraction_profile(tmp_path, base_url=fake_llm.url, falkordb_port=0,
                                     graph="unused", sources=src, graph_table=table)
        (src / "transcripts" / "a.md").write_text(transcript(["Ann Lee", "Bob Stone"]))
        (src / "research" / "r.yaml").write_text("title: Briefing\nsummary: Ann Lee joined "
                                                 "Acme Corp.\n")
        env = {**os.environ, "PREFECT_API_URL": harness_api_url()}
        run = subprocess.run([SLM, "run", "--phases", "extract", "--profile", str(profile)],
                             env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        with Neo4jStore(table["uri"], table["user"], table["password"]) as store:
            assert store.stats()["nodes"]["Document"] == 2
            assert store.missing_keys() == []
            docs = {r["d"] for r in store.query(
                "MATCH (:Person {key: 'Person:ann lee'})-[:MENTIONED_IN]->(d:Document) "
                "RETURN d.id AS d")}
            assert docs == {"transcripts/a.md", "research/r.yaml"}
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole process group
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.usefixtures("prefect_api")
def test_a_damaged_neo4j_graph_is_caught_and_restored_from_its_export(
        tmp_path: Path, fake_llm: FakeOpenAI, neo4j_server: LocalNeo4j,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Phase 1 keeps a logical export of the Neo4j graph after each run that wrote, holding the
    counts the ledger records. Nodes deleted behind its back stop the next run with the way
    back; `graph restore --replace` keeps the damaged graph as an export, replays the snapshot
    (property types included), and the next run finds the graph as the ledger says."""
    from flows.cli import main as cli
    from flows.extract import extract
    from tasks.graph.snapshots import GraphDamaged, list_local

    empty_neo4j(neo4j_server).close()
    src = tmp_path / "docs"
    table = {"type": "neo4j", "uri": neo4j_server.uri, "user": neo4j_server.user,
             "password": neo4j_server.password, "batch_size": 5}
    profile = extraction_profile(tmp_path, base_url=fake_llm.url, falkordb_port=0,
                                 graph="unused", sources=src, graph_table=table)
    (src / "transcripts" / "a.md").write_text(transcript(["Ann Lee", "Bob Stone"]))
    (src / "transcripts" / "b.md").write_text(transcript(["Cy Young", "Bob Stone"]))
    report = extract(profile=str(profile)).model_dump(mode="json")
    graph = report["graph"]
    snap = graph["snapshot"]
    assert snap["file"] == "graph.jsonl.gz" and not snap.get("reused")
    assert {"nodes": snap["nodes"], "relationships": snap["relationships"]} == {
        "nodes": graph["nodes"], "relationships": graph["relationships"]}
    with Neo4jStore(neo4j_server.uri, neo4j_server.user, neo4j_server.password) as store:
        before = typed_dump(store)
        store._write("MATCH (p:Person {key: 'Person:bob stone'}) DETACH DELETE p")
    with pytest.raises(GraphDamaged, match=r"Person 2 of 3.*restore the last snapshot \(newest: "
                       + snap["name"]):
        extract(profile=str(profile))
    assert cli(["graph", "restore", "--profile", str(profile)]) == 2  # not empty: says how
    assert "is not empty — add --replace to export what it holds" in capsys.readouterr().err
    assert cli(["graph", "restore", "--replace", "--profile", str(profile)]) == 0
    replaced = list((tmp_path / "state" / "artifacts" / "graph-snapshots").glob("replaced-*"))
    assert len(replaced) == 1
    with Neo4jStore(neo4j_server.uri, neo4j_server.user, neo4j_server.password) as store:
        assert typed_dump(store) == before
    again = extract(profile=str(profile)).model_dump(mode="json")
    assert again["graph"]["check"] == "ok"
    assert [s.name for s in list_local(tmp_path / "state" / "artifacts")] == [snap["name"]]


def typed_dump(store: Neo4jStore) -> list[tuple[object, ...]]:
    """Every node and relationship with every property and its type's name, sorted."""
    def typed(props: dict[str, object]) -> list[tuple[str, str, str]]:
        return sorted((k, type(v).__name__, repr(v)) for k, v in props.items())

    nodes = [(tuple(sorted(r["l"])), typed(r["p"])) for r in store.query(
        "MATCH (n) RETURN labels(n) AS l, properties(n) AS p")]
    rels = [(r["t"], r["a"], r["b"], typed(r["p"])) for r in store.query(
        "MATCH (a)-[r]->(b) RETURN type(r) AS t, coalesce(a.key, a.id) AS a, "
        "coalesce(b.key, b.id) AS b, properties(r) AS p")]
    return sorted(nodes) + sorted(rels)  # type: ignore[arg-type]
