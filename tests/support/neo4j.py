"""The tests' Neo4j: its settings and a graph emptied for each test (the fixture that starts
the server, `neo4j_server`, is in tests/integration/conftest.py)."""

from __future__ import annotations

from tasks.graph.neo4j_local import LocalNeo4j
from tasks.graph.neo4j_store import Neo4jStore

# A transaction capped at 64 MiB (production's cap is 70 % of the heap for all transactions
# together, dbms.memory.transaction.total.max): a test can overflow it with ~30 MB of text.
NEO4J_SETTINGS = {"db.memory.transaction.max": "64m"}


def empty_neo4j(server: LocalNeo4j, batch_size: int = 7, schema: bool = True) -> Neo4jStore:
    """A store on the server's graph, emptied of data, constraints and indexes (each test
    starts from nothing, as on a new database), its schema then ensured unless `schema` is
    False."""
    store = Neo4jStore(server.uri, server.user, server.password, server.database, batch_size)
    store.clear()
    for r in store._read("SHOW CONSTRAINTS YIELD name RETURN name"):
        store._write(f"DROP CONSTRAINT `{r['name']}`")
    for r in store._read("SHOW INDEXES YIELD name, type WHERE type <> 'LOOKUP' RETURN name"):
        store._write(f"DROP INDEX `{r['name']}`")
    if schema:
        store.ensure_schema()
    return store
