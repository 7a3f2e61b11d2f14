"""FalkorDB as the graph store: the store (its native client), and how this project opens,
snapshots, restores and checks the graph a FalkorDBGraph block describes. With no host the
block's server is embedded: started (or reused) on 127.0.0.1, waited for while it loads its
data, compacted and stopped when done."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from falkordb import FalkorDB

from blocks.graph import FalkorDBGraph
from tasks.graph import falkordb_server, snapshots
from tasks.graph import queries as q
from tasks.graph.store import GraphServer, GraphStore, Restored
from tasks.records import GraphSnapshot
from tasks.shared.errors import ConfigError, GraphError


class FalkorDBStore(GraphStore):
    def __init__(self, host: str, port: int, graph: str = "slm", batch_size: int = 1000,
                 password: str | None = None) -> None:
        super().__init__(batch_size)
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

    def ensure_schema(self) -> None:
        for stmt in q.SCHEMA["falkordb"] + q.INDEXES["falkordb"]:  # before the constraints
            try:
                self._write(stmt)
            except GraphError as e:
                if "already indexed" not in str(e).lower():
                    raise
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


@contextmanager
def open_store(block: FalkorDBGraph,
               progress: Callable[[str], None] | None) -> Iterator[GraphStore]:
    """The embedded server is started (or reused) and has loaded its data. On the way out its
    append-only file is compacted (if anything was written), and the server is stopped if
    this call started it."""
    started = False
    pw = block.password.get_secret_value() if block.password else None
    port: int | None
    if block.embedded:
        rec, started = falkordb_server.start(Path(block.data_dir), block.port,
                                             load_timeout=block.load_timeout_seconds,
                                             progress=progress)
        host, port = "127.0.0.1", rec.port
    else:  # an existing server may be loading its data too
        host, port = str(block.host), block.port
        falkordb_server.wait_loaded(falkordb_server.Address(host, port or 6379, pw),
                                    block.load_timeout_seconds, progress,
                                    f" ({host}:{port or 6379})")
    try:
        store = FalkorDBStore(host, port or 6379, block.graph_name, block.batch_size, pw)
        with store:
            store.ensure_schema()
            yield store
    finally:
        if block.embedded:
            # Also on a server this call reused (one a killed run left up): a rewrite is
            # safe next to other clients, and skipped when nothing was written — or when
            # the server is gone (stopped by PID on Ctrl-C).
            try:
                if falkordb_server.running_port(Path(block.data_dir)) is not None:
                    falkordb_server.compact(port or 6379, block.load_timeout_seconds)
            except Exception as e:  # noqa: BLE001 - the AOF still holds every write
                if progress:
                    progress(f"FalkorDB: append-only file not compacted ({e}); the next "
                             "start replays it")
            finally:
                if started:
                    falkordb_server.stop(Path(block.data_dir))


def embedded_port(block: FalkorDBGraph) -> int | None:
    """The port of the embedded FalkorDB running on the block's data_dir now (None: not
    running, or not embedded)."""
    return falkordb_server.running_port(Path(block.data_dir)) if block.embedded else None


def snapshot_writer(block: FalkorDBGraph, store: GraphStore,
                    stats: dict[str, dict[str, int]]) -> Callable[[Path], Path] | None:
    """The embedded server's RDB image (None: not embedded, or not running)."""
    port = embedded_port(block)
    if port is None:
        return None
    return lambda folder: falkordb_server.save_rdb(port, folder / "graph.rdb")


def restore(block: FalkorDBGraph, snap: GraphSnapshot, root: Path, replace: bool) -> Restored:
    """The embedded server's data folder replaced by the snapshot's (the server must be
    stopped; the old folder is kept beside it)."""
    if not block.embedded:
        raise ConfigError("graph restore: the embedded FalkorDB and Neo4j are restored here; "
                          "restore an external FalkorDB with its own tools")
    folder = Path(block.data_dir).resolve()
    moved = snapshots.restore(folder, snap)
    return Restored(str(folder), snap.counts(), moved if moved != folder else None)


def server(block: FalkorDBGraph) -> GraphServer:
    if block.embedded:
        return GraphServer(f"the embedded FalkorDB on {block.data_dir}")
    host, port = str(block.host), block.port or 6379
    secret = block.password.get_secret_value() if block.password else ""
    return GraphServer(
        f"FalkorDB at {host}:{port}", secret, "start the server, or fix the graph block's "
        "host, port and password (empty host: the embedded server)", loads_data=True,
        connect=lambda: FalkorDBStore(host, port, block.graph_name, 1, secret or None))
