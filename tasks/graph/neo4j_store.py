"""Neo4j as the graph store: the store (the official driver, Bolt), and how this project
opens, snapshots (a logical export), restores (a replay) and checks the graph a Neo4jGraph
block describes."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from blocks.graph import Neo4jGraph
from tasks.graph import queries as q
from tasks.graph import snapshots
from tasks.graph.export import export, replay
from tasks.graph.store import DEFAULT_BATCH_BYTES, GraphServer, GraphStore, Restored
from tasks.records import GraphSnapshot
from tasks.shared.errors import ConfigError, GraphError

# Neo4j status codes (Neo4j 5 "Status codes" reference). A transaction over the memory cap
# (db.memory.transaction.max, or the pool of dbms.memory.transaction.total.max) is a
# TransientError, which the driver's managed transactions would retry for 30 s — and it can be
# raised at COMMIT, outside any transaction function. It fails the same way each time, so the
# store runs its own retries and raises this one at once.
_OUT_OF_MEMORY = ("Neo.TransientError.General.MemoryPoolOutOfMemoryError",
                  "Neo.TransientError.General.TransactionMemoryLimit")
_FORBIDDEN = "Neo.ClientError.Security.Forbidden"
RETRY_SECONDS = 30.0  # the driver's own max_transaction_retry_time


class Neo4jStore(GraphStore):
    """Neo4j 5.26 LTS or 2025.x through the official driver (6.x).

    Each statement is one transaction, retried while the driver calls its error retryable
    (a leader switch, a lost connection, a deadlock) for up to RETRY_SECONDS — except running
    out of transaction memory. Every session of a store shares one bookmark manager, so each
    statement reads what the store's earlier ones wrote, on any cluster member (causal
    consistency): the batch's e-mail lookup sees the Persons the previous batch merged, and
    `stats()` the last write."""

    def __init__(self, uri: str, user: str, password: str, database: str = "neo4j",
                 batch_size: int = 1000, batch_bytes: int = DEFAULT_BATCH_BYTES) -> None:
        super().__init__(batch_size, batch_bytes)
        import neo4j

        self._neo4j = neo4j
        self._database = database
        # "unrecognized" notifications say a label or property does not exist yet: every
        # statement on a new graph would log one
        self._driver = neo4j.GraphDatabase.driver(
            uri, auth=(user, password), notifications_disabled_classifications=["UNRECOGNIZED"])
        self._bookmarks = neo4j.GraphDatabase.bookmark_manager()
        try:
            self._driver.verify_connectivity()
        except Exception as e:  # noqa: BLE001
            self._driver.close()
            # Never echo credentials: the message names the URI and user only.
            code = getattr(e, "code", None) or type(e).__name__
            raise GraphError(f"cannot connect to Neo4j at {uri} as {user!r}: {code} — check "
                             "the graph block's uri, user and password") from e
        self.location = f"{uri} (database {database})"

    def _once(self, write: bool, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        mode = self._neo4j.WRITE_ACCESS if write else self._neo4j.READ_ACCESS
        with self._driver.session(database=self._database, default_access_mode=mode,
                                  bookmark_manager=self._bookmarks) as session, \
                session.begin_transaction() as tx:
            rows = [r.data() for r in tx.run(query, params)]
            tx.commit()
            return rows

    def read_together(self, queries: Sequence[str]) -> Iterator[tuple[int, dict[str, Any]]]:
        """One read transaction, rows streamed as the server sends them (not retried: a
        caller that needs all of them runs it again)."""
        try:
            with self._driver.session(database=self._database,
                                      default_access_mode=self._neo4j.READ_ACCESS,
                                      bookmark_manager=self._bookmarks) as session, \
                    session.begin_transaction() as tx:
                for i, query in enumerate(queries):
                    for record in tx.run(query):
                        yield i, record.data()
        except (self._neo4j.exceptions.Neo4jError, self._neo4j.exceptions.DriverError) as e:
            raise GraphError(f"Neo4j: reading failed: {type(e).__name__}: {e}") from e

    def _run(self, write: bool, query: str, params: dict[str, Any] | None) -> list[dict[str, Any]]:
        errors = self._neo4j.exceptions
        deadline, delay = time.monotonic() + RETRY_SECONDS, 1.0
        while True:
            try:
                return self._once(write, query, params or {})
            except (errors.Neo4jError, errors.DriverError) as e:
                code = getattr(e, "code", None)
                if code in _OUT_OF_MEMORY:
                    rows = len((params or {}).get("rows", ()))
                    raise GraphError(
                        f"Neo4j ran out of transaction memory ({code}) on a statement of "
                        f"{rows} row(s) — lower the graph block's batch_bytes or batch_size, "
                        "or raise the server's db.memory.transaction.max and heap "
                        "(docs/operations.md)") from e
                if e.is_retryable() and time.monotonic() + delay < deadline:
                    time.sleep(delay * random.uniform(0.8, 1.2))
                    delay *= 2
                    continue
                what = f"{code}: {e.message}" if code else f"{type(e).__name__}: {e}"
                raise GraphError(f"Neo4j rejected a statement: {what}") from e

    def _write(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self._run(True, query, params)

    def _read(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self._run(False, query, params)

    def missing_keys(self) -> list[str]:
        """The keys of q.UNIQUE_KEYS that no uniqueness constraint (or node key) holds now,
        as "Label.property"."""
        held = {(tuple(r["labels"] or ()), tuple(r["properties"] or ()))
                for r in self._read(q.SHOW_KEY_CONSTRAINTS)}
        return [f"{label}.{prop}" for _, label, prop in q.UNIQUE_KEYS
                if ((label,), (prop,)) not in held]

    def ensure_schema(self) -> None:
        """One unique constraint per key (IF NOT EXISTS: a present one is no error), judged by
        the server's error code, then checked with SHOW CONSTRAINTS: a constraint that a
        same-named one of another shape stood in for is a failure, not a silent success."""
        for (name, label, prop), stmt in zip(q.UNIQUE_KEYS, q.SCHEMA["neo4j"], strict=True):
            try:
                self._write(stmt)
            except GraphError as e:
                raise GraphError(self._schema_failure(name, label, prop, e)) from e
        for stmt in q.INDEXES["neo4j"]:
            self._write(stmt)
        missing = self.missing_keys()
        if missing:
            taken = sorted(r["name"] for r in self._read("SHOW CONSTRAINTS YIELD name "
                                                         "RETURN name"))
            raise GraphError(f"Neo4j: no unique constraint on {', '.join(missing)} after "
                             f"creating them (constraints present: {taken}) — a constraint "
                             "named like ours holds something else: drop it "
                             "(DROP CONSTRAINT name) and run again")

    def _schema_failure(self, name: str, label: str, prop: str, error: GraphError) -> str:
        code = getattr(error.__cause__, "code", "") or ""
        what = f"Neo4j refused the unique constraint {name} on :{label}({prop}) ({code})"
        if code == _FORBIDDEN:
            return (f"{what} — the graph block's user lacks the privilege: have an admin run "
                    f"`GRANT CREATE CONSTRAINT ON DATABASE {self._database} TO <its role>` or "
                    "create the constraints once (docs/operations.md)")
        indexes = [r["name"] for r in self._read(q.SHOW_FREE_INDEXES)
                   if list(r["labels"] or ()) == [label] and list(r["properties"] or ()) == [prop]]
        if indexes:
            return (f"{what} — the index {indexes[0]!r} already covers :{label}({prop}); a "
                    f"constraint brings its own: run `DROP INDEX {indexes[0]}` and run again")
        dups = self._read(q.duplicate_keys(label, prop))
        if dups:
            shown = ", ".join(f"{r['value']!r} ({r['n']} nodes)" for r in dups)
            return (f"{what} — these {prop} values are held by more than one :{label}: "
                    f"{shown}; merge or delete the duplicates and run again")
        return f"{what}: {error}"

    def close(self) -> None:
        self._driver.close()


@contextmanager
def open_store(block: Neo4jGraph, progress: Callable[[str], None] | None) -> Iterator[GraphStore]:
    store = Neo4jStore(block.uri, block.user, block.password.get_secret_value(), block.database,
                       block.batch_size, block.batch_bytes)
    with store:
        store.ensure_schema()
        yield store


def embedded_port(block: Neo4jGraph) -> int | None:
    return None  # a server of its own, never embedded


def snapshot_writer(block: Neo4jGraph, store: GraphStore,
                    stats: dict[str, dict[str, int]]) -> Callable[[Path], Path] | None:
    """A logical export, which must hold `stats` (the counts the ledger records for the run)."""
    def export_to(folder: Path) -> Path:
        out = folder / "graph.jsonl.gz"
        got = export(store, out)
        if got != stats:
            raise GraphError(f"the graph changed while it was exported (it held {stats}, the "
                             f"export {got}): was another process writing to it?")
        return out
    return export_to


def restore(block: Neo4jGraph, snap: GraphSnapshot, root: Path, replace: bool) -> Restored:
    """The export replayed into the database, which must be empty unless `replace`: then what
    it holds is exported first (beside the snapshots, replaced-<time>.jsonl.gz) and emptied."""
    data = snapshots.verified(snap)
    kept = None
    with open_store(block, None) as store:
        if store.stats()["nodes"]:
            if not replace:
                raise ConfigError(f"graph restore: {block.describe()} is not empty — add "
                                  "--replace to export what it holds beside the snapshots, "
                                  "empty it and restore, or restore into an empty database")
            kept = root / snapshots.SNAPSHOTS / f"replaced-{snapshots.stamp()}.jsonl.gz"
            export(store, kept)
            store.clear()
        return Restored(block.describe(), replay(store, data), kept)


def server(block: Neo4jGraph) -> GraphServer:
    secret = block.password.get_secret_value()
    return GraphServer(
        f"Neo4j at {block.uri} as {block.user!r}", secret,
        "fix the graph block's uri, user and password (docs/operator-gcp.md, sections 0 and 4)",
        connect=lambda: Neo4jStore(block.uri, block.user, secret, block.database, 1))
