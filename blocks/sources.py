"""Where the day's documents are: one folder per stream (checked when a run reads them:
tasks/extraction/inputs.py). The streams themselves, and the field each one's folder is read
from, are tasks/extraction/streams.py's registry."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field


class DocumentSources(Block):
    """Roots of the document streams. An empty root disables that stream."""

    _block_type_name = "SLM Document Sources"

    # The streams' own fields (tasks/extraction/streams.py `source_field`); a saved block keeps
    # loading as long as these stay, and a new field needs a default.
    transcripts: str | None = Field(default=None, description="Meeting transcripts (*.md).")
    research: str | None = Field(default=None, description="Agent research (*.yaml, *.yml, *.md).")
    contacts: str | None = Field(default=None, description="Contact records (*.json).")
    other: dict[str, str] = Field(
        default_factory=dict,
        description="Folders of the streams without a field of their own: stream name → "
        "folder (in a profile, a [sources.other] table). Empty: none.")
    max_document_mb: float = Field(default=2.0, gt=0, le=1024, description="Larger files are rejected.")
