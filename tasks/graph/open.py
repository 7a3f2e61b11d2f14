"""Open the graph store a profile's graph block describes: the embedded FalkorDB is started
(or reused) and waited for while it loads its data; Neo4j is connected to. The blocks hold the
settings (blocks/graph.py). The one place that asks which kind of graph block it holds:
everything else asks the block (`embedded`) or these functions."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from blocks.graph import FalkorDBGraph, Neo4jGraph
from tasks.graph import falkordb_server, snapshots
from tasks.graph.backends import FalkorDBStore, Neo4jStore
from tasks.graph.export import export, replay
from tasks.graph.store import GraphStore
from tasks.records import GraphSnapshot
from tasks.shared.errors import ConfigError, GraphError

Progress = logging.Logger | logging.LoggerAdapter[Any] | TextIO | Callable[[str], None]
"""Where open_graph tells of a slow start: a logger (a flow's run logger), a stream, or a
function of tasks/ (or a test's) taking each line."""


def _teller(to: Progress | None) -> Callable[[str], None] | None:
    if to is None:
        return None
    if isinstance(to, logging.Logger | logging.LoggerAdapter):
        return to.info
    if callable(to):
        return to
    stream = to

    def tell(message: str) -> None:
        print(message, file=stream, flush=True)
    return tell


@contextmanager
def open_graph(block: FalkorDBGraph | Neo4jGraph,
               progress: Progress | None = None) -> Iterator[GraphStore]:
    """The store, ready, with its schema ensured (see _open_falkordb for the embedded
    server's start and stop); a slow start (the embedded server loading its data) is told
    to `progress`."""
    if isinstance(block, Neo4jGraph):
        store: GraphStore = Neo4jStore(block.uri, block.user, block.password.get_secret_value(),
                                       block.database, block.batch_size, block.batch_bytes)
        with store:
            store.ensure_schema()
            yield store
        return
    with _open_falkordb(block, _teller(progress)) as falkor:
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


def embedded_port(block: FalkorDBGraph | Neo4jGraph) -> int | None:
    """The port of the embedded FalkorDB running on the block's data_dir now (None: not
    running, or not embedded)."""
    if not block.embedded or not isinstance(block, FalkorDBGraph):
        return None
    return falkordb_server.running_port(Path(block.data_dir))


def snapshot_writer(block: FalkorDBGraph | Neo4jGraph, store: GraphStore,
                    stats: dict[str, dict[str, int]]) -> Callable[[Path], Path] | None:
    """How a snapshot of this graph is written into a folder (tasks/graph/snapshots.py take),
    or None where none is kept: the embedded FalkorDB's RDB image, Neo4j's logical export
    (which must hold `stats`, the counts the ledger records for the run)."""
    if not block.snapshots_to_keep():
        return None
    if isinstance(block, Neo4jGraph):
        def export_to(folder: Path) -> Path:
            out = folder / "graph.jsonl.gz"
            got = export(store, out)
            if got != stats:
                raise GraphError(f"the graph changed while it was exported (it held {stats}, "
                                 f"the export {got}): was another process writing to it?")
            return out
        return export_to
    port = embedded_port(block)
    if port is None:
        return None
    return lambda folder: falkordb_server.save_rdb(port, folder / "graph.rdb")


@dataclass(frozen=True)
class Restored:
    """What `restore_graph` did: where, the counts the graph now holds, and where the data it
    replaced is kept (None: there was none)."""

    where: str
    counts: dict[str, dict[str, int]]
    kept: Path | None


def restore_graph(block: FalkorDBGraph | Neo4jGraph, snap: GraphSnapshot, root: Path,
                  replace: bool = False) -> Restored:
    """Put a snapshot back. The embedded FalkorDB's data folder is replaced (the server must
    be stopped; the old folder is kept beside it). A Neo4j export is replayed into the
    database, which must be empty unless `replace`: then what it holds is exported first
    (beside the snapshots, replaced-<time>.jsonl.gz) and it is emptied."""
    if isinstance(block, Neo4jGraph):
        data = snapshots.verified(snap)
        kept = None
        with open_graph(block) as store:
            if store.stats()["nodes"]:
                if not replace:
                    raise ConfigError(f"graph restore: {block.describe()} is not empty — add "
                                      "--replace to export what it holds beside the "
                                      "snapshots, empty it and restore, or restore into an "
                                      "empty database")
                kept = root / snapshots.SNAPSHOTS / f"replaced-{snapshots.stamp()}.jsonl.gz"
                export(store, kept)
                store.clear()
            return Restored(block.describe(), replay(store, data), kept)
    if not block.embedded:
        raise ConfigError("graph restore: the embedded FalkorDB and Neo4j are restored here; "
                          "restore an external FalkorDB with its own tools")
    folder = Path(block.data_dir).resolve()
    moved = snapshots.restore(folder, snap)
    return Restored(str(folder), snap.counts(), moved if moved != folder else None)


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
            "fix the graph block's uri, user and password (docs/operator-gcp.md, sections 0 and 4)",
            connect=lambda: Neo4jStore(block.uri, block.user, secret, block.database, 1))
    if block.embedded:
        return GraphServer(f"the embedded FalkorDB on {block.data_dir}")
    host, port = str(block.host), block.port or 6379
    secret = block.password.get_secret_value() if block.password else ""
    return GraphServer(
        f"FalkorDB at {host}:{port}", secret, "start the server, or fix the graph block's "
        "host, port and password (empty host: the embedded server)", loads_data=True,
        connect=lambda: FalkorDBStore(host, port, block.graph_name, 1, secret or None))
