"""Where the day's documents are: one folder per stream (checked when a run reads them:
tasks/extraction/inputs.py)."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field


class DocumentSources(Block):
    """Roots of the three document streams. An empty root disables that stream."""

    _block_type_name = "SLM Document Sources"

    transcripts: str | None = Field(default=None, description="Meeting transcripts (*.md).")
    research: str | None = Field(default=None, description="Agent research (*.yaml, *.yml, *.md).")
    contacts: str | None = Field(default=None, description="Contact records (*.json).")
    max_document_mb: float = Field(default=2.0, gt=0, le=1024, description="Larger files are rejected.")
