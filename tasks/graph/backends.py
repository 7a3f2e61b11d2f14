"""The two graph backends: FalkorDB (native client) and Neo4j (official driver, Bolt)."""

from __future__ import annotations

from typing import Any

from tasks.errors import GraphError
from tasks.graph.queries import Dialect
from tasks.graph.store import GraphStore


class FalkorDBStore(GraphStore):
    dialect = "falkordb"

    def __init__(self, host: str, port: int, graph: str = "slm", batch_size: int = 1000,
                 password: str | None = None) -> None:
        super().__init__(batch_size)
        from falkordb import FalkorDB

        try:
            self._db = FalkorDB(host=host, port=port, password=password)
            self._graph = self._db.select_graph(graph)
            self._db.connection.ping()
        except Exception as e:  # noqa: BLE001 - redis raises many connection types
            raise GraphError(f"cannot reach FalkorDB at {host}:{port}: {e} — is it running?") \
                from e
        self.location = f"falkordb://{host}:{port}/{graph}"

    @staticmethod
    def _rows(result: Any) -> list[dict[str, Any]]:
        header = [h[1] if isinstance(h, list | tuple) else h for h in (result.header or [])]
        return [dict(zip(header, row, strict=False)) for row in result.result_set or []]

    def _write(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        try:
            return self._rows(self._graph.query(query, params))
        except Exception as e:  # noqa: BLE001
            raise GraphError(f"FalkorDB rejected a statement: {e}") from e

    def _read(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        try:
            return self._rows(self._graph.ro_query(query, params))
        except Exception as e:  # noqa: BLE001
            if "empty key" in str(e).lower() or "does not exist" in str(e).lower():
                return []  # the graph is created by its first write
            raise GraphError(f"FalkorDB rejected a query: {e}") from e

    def _schema_statement_done(self, error: Exception) -> bool:
        return "already indexed" in str(error).lower()

    def ensure_schema(self) -> None:
        super().ensure_schema()  # range indexes first: the constraints need them
        for label, prop in (("Entity", "key"), ("Document", "id")):
            try:
                # Built asynchronously by the server (PENDING, then OPERATIONAL).
                self._graph.create_node_unique_constraint(label, prop)
            except Exception as e:  # noqa: BLE001
                if "already exists" not in str(e).lower():
                    raise GraphError(f"FalkorDB refused the unique constraint on "
                                     f"{label}.{prop}: {e}") from e

    def close(self) -> None:
        try:
            self._db.connection.close()
        except Exception:  # noqa: BLE001 - closing a dead connection is not an error
            pass


class Neo4jStore(GraphStore):
    """Neo4j through the official driver; managed transactions (retried by the driver).

    `dialect` selects the schema statements only: "neo4j" for a Neo4j server, "falkordb"
    when the driver talks to FalkorDB's Bolt port (docs/pipeline.md: tested that way here)."""

    def __init__(self, uri: str, user: str, password: str, database: str | None = None,
                 batch_size: int = 1000, dialect: Dialect = "neo4j") -> None:
        super().__init__(batch_size)
        import neo4j

        self.dialect = dialect
        self._database = database
        self._driver = neo4j.GraphDatabase.driver(uri, auth=(user, password))
        try:
            self._driver.verify_connectivity()
        except Exception as e:  # noqa: BLE001
            self._driver.close()
            # Never echo credentials: the message names the URI and user only.
            raise GraphError(f"cannot connect to Neo4j at {uri} as {user!r}: "
                             f"{type(e).__name__} — check the graph block's uri, user and "
                             "password") from e
        self.location = f"{uri} (database {database or 'default'})"

    def _run(self, write: bool, query: str, params: dict[str, Any] | None) -> list[dict[str, Any]]:
        def work(tx: Any) -> list[dict[str, Any]]:
            return [r.data() for r in tx.run(query, params or {})]

        try:
            with self._driver.session(database=self._database) as session:
                run = session.execute_write if write else session.execute_read
                return run(work)
        except Exception as e:  # noqa: BLE001
            raise GraphError(f"Neo4j rejected a statement: {e}") from e

    def _write(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self._run(True, query, params)

    def _read(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self._run(False, query, params)

    def _schema_statement_done(self, error: Exception) -> bool:
        return "already" in str(error).lower()

    def close(self) -> None:
        self._driver.close()
