"""Where the day's documents are: one folder per stream."""

from __future__ import annotations

from pathlib import Path

from prefect.blocks.core import Block
from pydantic import Field

from tasks.errors import ConfigError


class DocumentSources(Block):
    """Roots of the three document streams. An empty root disables that stream."""

    _block_type_name = "SLM Document Sources"

    transcripts: str | None = Field(default=None, description="Meeting transcripts (*.md).")
    research: str | None = Field(default=None, description="Agent research (*.yaml, *.yml, *.md).")
    contacts: str | None = Field(default=None, description="Contact records (*.json).")
    max_document_mb: float = Field(default=2.0, gt=0, le=1024, description="Larger files are rejected.")

    def roots(self) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for stream in ("transcripts", "research", "contacts"):
            value = getattr(self, stream)
            if not value:
                continue
            path = Path(value).expanduser()
            if not path.is_dir():
                raise ConfigError(
                    f"sources.{stream}: folder {path.resolve()} does not exist — create it, or "
                    f"fix '{stream}' in the profile / sources block (empty disables the stream)"
                )
            out[stream] = path
        if not out:
            raise ConfigError("sources: no stream configured — set transcripts, research or contacts")
        return out
