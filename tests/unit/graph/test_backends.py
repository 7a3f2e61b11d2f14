"""The graph stores (tasks/graph/falkordb_store.py, neo4j_store.py) where no database
answers: an error that names the store, never its password."""

import pytest

from tasks.graph.neo4j_store import Neo4jStore
from tasks.shared.processes import free_port


def test_neo4j_connection_error_never_shows_the_password() -> None:
    from tasks.shared.errors import GraphError

    with pytest.raises(GraphError) as e:
        Neo4jStore(f"bolt://127.0.0.1:{free_port()}", "neo4j", "s3cret-pw")
    assert "s3cret-pw" not in str(e.value) and "neo4j" in str(e.value)
