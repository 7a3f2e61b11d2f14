"""The Neo4j backend through the official driver against FalkorDB's Bolt port.

Run inside a private network namespace (`unshare -n`), because FalkorDB's Bolt listener binds
every interface: there, every interface is a fresh loopback. Prints one JSON line.

FalkorDB's Bolt server crashes on query parameters over ~4 KB, so batches stay tiny (2 rows);
the batched Cypher itself is exercised natively by test_graph_store.py.
"""

import json
import sys
import tempfile
from pathlib import Path

from tasks.graph import falkordb_server
from tasks.graph.backends import FalkorDBStore, Neo4jStore
from tests.support.graph_batches import batch_for, mark

BOLT = 7687


def main() -> None:
    data = Path(tempfile.mkdtemp())
    rec, _ = falkordb_server.start(data, bolt_port=BOLT, persist=False)
    out: dict[str, object] = {}
    try:
        # No TCP probe of the Bolt port: a connection closed before the handshake kills
        # FalkorDB's Bolt listener. It is up before the Redis port (which start() waited for).
        with Neo4jStore(f"bolt://127.0.0.1:{BOLT}", "falkordb", "", batch_size=2,
                        dialect="falkordb") as neo:
            neo.ensure_schema()
            neo.upsert(batch_for("d1", ["Ann", "Bob", "Cy"]))
            mark(neo, "d1")  # type: ignore[arg-type]
            out["works_for"] = neo.stats()["relationships"]["WORKS_FOR"]
            out["hash"] = neo.document_states()["d1"]["hash"]
            # Over Bolt, FalkorDB writes to the graph named 'falkordb'.
            native = FalkorDBStore("127.0.0.1", rec.port, "falkordb")
            out["native_persons"] = native.stats()["nodes"]["Person"]
            neo.retract(["d1"], delete=True)
            out["pruned"] = neo.prune_orphans()
        out["after"] = native.stats()
    finally:
        falkordb_server.stop(data)
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
