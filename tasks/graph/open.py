"""Open the graph store a profile's graph block describes: the embedded FalkorDB is started
(or reused) and waited for while it loads its data; Neo4j is connected to. The blocks hold the
settings (blocks/graph.py). The one place that asks which kind of graph block it holds:
everything else asks the block (`embedded`) or these functions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from blocks.graph import FalkorDBGraph, Neo4jGraph
from tasks.graph import falkordb_server
from tasks.graph.backends import FalkorDBStore, Neo4jStore
from tasks.graph.store import GraphStore


@contextmanager
def open_graph(block: FalkorDBGraph | Neo4jGraph,
               progress: Callable[[str], None] | None = None) -> Iterator[GraphStore]:
    """The store, ready, with its schema ensured (see _open_falkordb for the embedded
    server's start and stop)."""
    if isinstance(block, Neo4jGraph):
        store: GraphStore = Neo4jStore(block.uri, block.user, block.password.get_secret_value(),
                                       block.database, block.batch_size, block.schema_dialect)
        with store:
            store.ensure_schema()
            yield store
        return
    with _open_falkordb(block, progress) as falkor:
        yield falkor


@contextmanager
def _open_falkordb(block: FalkorDBGraph,
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
        falkordb_server.wait_loaded(host, port or 6379, pw, block.load_timeout_seconds,
                                    progress, f" ({host}:{port or 6379})")
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


def embedded_port(block: FalkorDBGraph | Neo4jGraph) -> int | None:
    """The port of the embedded FalkorDB running on the block's data_dir now (None: not
    running, or not embedded)."""
    if not block.embedded or not isinstance(block, FalkorDBGraph):
        return None
    return falkordb_server.running_port(Path(block.data_dir))


@dataclass(frozen=True)
class GraphServer:
    """The graph a check reads from, as it names it: `where` (never the password), the
    `secret` to keep out of its messages, the `fix` when it does not answer, whether an answer
    of "loading" means it is up (FalkorDB reading its data), and `connect` (None: the embedded
    FalkorDB, phase 1's to start)."""

    where: str
    secret: str = ""
    fix: str = ""
    loads_data: bool = False
    connect: Callable[[], GraphStore] | None = None


def graph_server(block: FalkorDBGraph | Neo4jGraph) -> GraphServer:
    """How the preflight reaches the block's server, one row at a time (batch size 1)."""
    if isinstance(block, Neo4jGraph):
        secret = block.password.get_secret_value()
        return GraphServer(
            f"Neo4j at {block.uri} as {block.user!r}", secret,
            "fix the graph block's uri, user and password (docs/operator-gcp.md, section 6)",
            connect=lambda: Neo4jStore(block.uri, block.user, secret, block.database, 1,
                                       block.schema_dialect))
    if block.embedded:
        return GraphServer(f"the embedded FalkorDB on {block.data_dir}")
    host, port = str(block.host), block.port or 6379
    secret = block.password.get_secret_value() if block.password else ""
    return GraphServer(
        f"FalkorDB at {host}:{port}", secret, "start the server, or fix the graph block's "
        "host, port and password (empty host: the embedded server)", loads_data=True,
        connect=lambda: FalkorDBStore(host, port, block.graph_name, 1, secret or None))
