"""Open the graph store a profile's graph block describes, snapshot it, restore it, and say how
the preflight reaches it. Each kind of block has one store module that does these its own way
(tasks/graph/falkordb_store.py: the embedded server started, waited for, compacted;
tasks/graph/neo4j_store.py: the driver, logical exports); STORES names it, keyed by the block's
type. This registry is the one place that knows the kinds: everything else asks the block
(`embedded`, `snapshots_to_keep()`) or these functions. A third store is its block
(blocks/graph.py), its store module and its queries, and its line here."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from blocks.graph import FalkorDBGraph, GraphBlock, Neo4jGraph
from tasks.graph import falkordb_store, neo4j_store
from tasks.graph.store import GraphServer, GraphStore, Restored
from tasks.records import GraphSnapshot

STORES: dict[type[GraphBlock], ModuleType] = {FalkorDBGraph: falkordb_store,
                                              Neo4jGraph: neo4j_store}

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
def open_graph(block: GraphBlock, progress: Progress | None = None) -> Iterator[GraphStore]:
    """The store, ready, with its schema ensured; a slow start (the embedded server loading
    its data) is told to `progress`."""
    with STORES[type(block)].open_store(block, _teller(progress)) as store:
        yield store


def embedded_port(block: GraphBlock) -> int | None:
    """The port of the embedded server running on the block's data now (None: not running,
    or not embedded)."""
    port: int | None = STORES[type(block)].embedded_port(block)
    return port


def snapshot_writer(block: GraphBlock, store: GraphStore,
                    stats: dict[str, dict[str, int]]) -> Callable[[Path], Path] | None:
    """How a snapshot of this graph is written into a folder (tasks/graph/snapshots.py take),
    or None where none is kept."""
    if not block.snapshots_to_keep():
        return None
    writer: Callable[[Path], Path] | None = STORES[type(block)].snapshot_writer(
        block, store, stats)
    return writer


def restore_graph(block: GraphBlock, snap: GraphSnapshot, root: Path,
                  replace: bool = False) -> Restored:
    """Put a snapshot back, as the block's store does it (its module's `restore`)."""
    restored: Restored = STORES[type(block)].restore(block, snap, root, replace)
    return restored


def graph_server(block: GraphBlock) -> GraphServer:
    """How the preflight reaches the block's server, one row at a time (batch size 1)."""
    server: GraphServer = STORES[type(block)].server(block)
    return server
