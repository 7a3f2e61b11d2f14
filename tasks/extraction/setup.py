"""Phase 1's setup, built once per run from the profile (Profile.phase1, tasks/profile.py): what
it asks of the model (ExtractionConfig), where the documents are, how they are batched, where the records and
the graph's snapshots go, and how much failure it tolerates. The `extract` flow and its stages
take it whole instead of its pieces."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from blocks.graph import GraphBlock
from blocks.inference import InferenceEndpoint
from tasks.extraction.calls import ExtractionConfig
from tasks.extraction.inputs import chunk_tokens, llm_client, response_schema
from tasks.extraction.llm import LLMClient
from tasks.graph.ontology import GraphSchema
from tasks.graph.snapshots import GraphCounts, SnapshotConfig

DEAD_LETTER_FILE = "dead-letter.jsonl"  # <state_dir>/…: every failure row, appended


def ask_for(endpoint: InferenceEndpoint, ontology: GraphSchema, gleanings: int = 0,
            judge: bool = False) -> ExtractionConfig:
    """What each request of `endpoint` asks under `ontology`: the endpoint's model, the
    bounded response schema, and the chunk size that leaves room for the prompt, the answer
    and `gleanings` passes; with `judge`, the model also settles namesakes."""
    return ExtractionConfig(endpoint.model, response_schema(endpoint, ontology),
                            chunk_tokens(endpoint, ontology, gleanings),
                            endpoint.chunk_overlap_tokens, ontology, gleanings, judge)


@dataclass(frozen=True)
class Phase1Setup:
    """Everything phase 1 reads from the profile, read once."""

    profile: str  # the profile's name, for the commands its messages suggest
    endpoint: InferenceEndpoint
    ask: ExtractionConfig
    roots: dict[str, Path]  # stream → folder, every configured stream
    max_bytes: int  # a larger document is a load failure
    batch_documents: int  # documents per extract-batch task
    max_failed_share: float  # more failed than this share of those attempted fails the phase
    state_dir: Path
    graph: GraphBlock
    snapshots: SnapshotConfig  # where the graph's snapshots go
    server_exit: Callable[[], str | None] | None = None  # this run's own server: how it died

    @property
    def dead_letter(self) -> Path:
        return self.state_dir / DEAD_LETTER_FILE

    @property
    def ledger(self) -> GraphCounts:
        """The counts the graph should hold (tasks/graph/snapshots.py), in the state folder."""
        return GraphCounts(self.state_dir, self.snapshots.graph)

    def client(self, base_url: str | None, base_urls: list[str] | None,
               deadline: float | None) -> LLMClient:
        """A client for the endpoint at every URL of `base_urls` (one per node; empty ones
        dropped), else at `base_url`, else at the profile's [inference] base_url; its requests
        must end by `deadline` (time.time() seconds; None: no deadline)."""
        return llm_client(self.endpoint, base_url,
                          base_urls=[u for u in (base_urls or []) if u] or None,
                          deadline=deadline, server_exit=self.server_exit)
