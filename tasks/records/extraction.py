"""Phase 1's records: the extraction report, its document counts, graph summary and answer
quality."""

from __future__ import annotations

import json
from typing import Any, Literal

from tasks.records.base import _Given, _Strict


class LedgerEntry(_Strict):
    """One graph's entry in <state_dir>/graph-ledger.json (tasks/graph/snapshots.py GraphCounts):
    the counts a run left (`nodes`, `relationships`: type → count), and while a run writes,
    `writing` with who and since when. Only the keys a run wrote are in the file."""

    nodes: dict[str, int] | None = None
    relationships: dict[str, int] | None = None
    recorded_at: str | None = None
    run: str | None = None
    writing: bool = False
    writer: str | None = None
    writing_since: str | None = None
    note: str | None = None


class FailedDocument(_Given):
    """A document, or a record of a file, that phase 1 could not process, and why: a row of the
    run's `failures` and of <state_dir>/dead-letter.jsonl (tasks/extraction/batch.py
    failure_record). A row has the keys it was given only — a file that could not be read has
    no model, a bad record has its index — in every dump, as the rows written before this
    record had."""

    id: str  # the document's id; "<document id>#<index>" for a bad record
    path: str
    stream: str
    hash: str | None
    error: str  # the kind: DocumentError, RecordError, HeldAfterFailure, LLMError, …
    message: str  # the reason and the fix
    attempts: int
    time: str
    model: str | None = None
    prompt_version: str | None = None
    # an extraction failure the graph holds (marked failed: not retried while unchanged);
    # False: the server never answered, so it is simply tried again on the next run
    held: bool | None = None
    record: int | None = None  # a bad record's index in its file


class DocumentCounts(_Strict):
    seen: int = 0
    extracted: int = 0
    skipped: int = 0
    failed: int = 0


class GraphSnapshot(_Given):
    """A snapshot of the graph (tasks/graph/snapshots.py): its snapshot.json (the
    fields up to `relationships`, `run` included), where it lies, and what the run that kept it
    did with it."""

    name: str  # <UTC stamp>-<run id's first 8>: sorts by age
    graph: str  # the graph it is of (GraphConfig.describe())
    created_at: str
    run: str | None
    bytes: int
    sha256: str
    nodes: dict[str, int]
    relationships: dict[str, int]
    file: str = "graph.rdb"  # FalkorDB's RDB image, or Neo4j's export (graph.jsonl.gz)
    path: str  # the local folder holding the file (not in snapshot.json)
    reused: bool | None = None  # the run wrote nothing: the newest snapshot still holds it
    gcs: str | None = None  # gs://…/<file>, when copied
    gcs_error: str | None = None  # why the copy to GCS failed (the local one stands)

    def counts(self) -> dict[str, dict[str, int]]:
        """Its counts, in the shape GraphStore.stats() gives them."""
        return {"nodes": self.nodes, "relationships": self.relationships}

    def meta(self) -> str:
        """snapshot.json's text."""
        return json.dumps(self.model_dump(include=SNAPSHOT_FILE_KEYS), indent=2,
                          sort_keys=True)


SNAPSHOT_FILE_KEYS = {"name", "graph", "created_at", "run", "bytes", "sha256", "nodes",
                      "relationships", "file"}


class SnapshotFailed(_Strict):
    """The run's snapshot could not be taken (the graph itself is intact): why."""

    error: str


class GraphSummary(_Strict):
    location: str | None = None
    description: str | None = None
    nodes: dict[str, int] = {}
    relationships: dict[str, int] = {}
    check: str | None = None
    snapshot: GraphSnapshot | SnapshotFailed | None = None  # keep_snapshot's record


def grounded_precision(grounded: int, ungrounded: int) -> float | None:
    """The share of names the model wrote that occur in their chunk's text; None when it
    wrote none (no figure rests on nothing)."""
    total = grounded + ungrounded
    return round(grounded / total, 4) if total else None


class AnswerQuality(_Strict):
    """How the night's answers kept to the graph schema and to their text, with no gold: the
    production model's quality, measured every night (tasks/extraction/answers.py)."""

    grounded_names: int = 0  # names the model wrote that occur in their chunk's text
    ungrounded_names: int = 0  # … that do not (invented, reasoning, instructions)
    grounded_precision: float | None = None
    ungrounded: list[str] = []  # the first few, "<doc>#<chunk>: <name>"
    # ungrounded names of a type the schema requires grounded (Person, …): dropped, by type
    dropped_ungrounded: dict[str, int] = {}
    pruned_relationships: dict[str, int] = {}  # "Person LOCATED_IN Decision": no pattern
    reversed_relationships: dict[str, int] = {}  # written backwards, turned around
    aliases_resolved: int = 0  # one-word names joined to the document's one full name
    gleanings: int = 0  # extra passes per chunk
    gleaning_failures: int = 0
    graph_schema: str = ""  # the schema file
    extraction_version: str = ""  # s<schema digest>-p<prompt digest>-g<gleanings>


class UnlinkedMention(_Strict):
    """A name alone in a document that fits several Persons of that name (namesakes, told
    apart by their addresses and employers): linked to none of them, its facts not written."""

    document: str
    name: str
    candidates: list[str]  # the Persons' keys
    relationships: int  # the document's facts about it, left out
    judge: str = ""  # the judge's reasons for none, or why it gave no verdict ("" : not asked)


class ExtractionReport(_Strict):
    """What phase 1 (flows/extract.py) returns, and carries in PhaseFailed when it fails."""

    documents: dict[str, DocumentCounts]
    llm_calls: int
    prompt_tokens: int
    completion_tokens: int
    llm_retries: int = 0
    entities: int
    relationships: int
    deleted: int
    pruned: int
    rejected_entity_types: dict[str, int]
    remapped_relationship_types: dict[str, int]
    dropped_fields: dict[str, int]
    unusable_answers: dict[str, int]
    bad_records: dict[str, int]
    dangling_relationships: int = 0
    failures: list[FailedDocument]
    dead_letter: str | None
    # None only in a run summary written before it held this report, whose graph block was
    # empty (RunSummary's migration drops it)
    graph: GraphSummary | None = None
    seconds: float = 0.0  # 0.0 in run summaries written before they held this report
    # "partial": the budget ended phase 1 before every document was reached; the rest are
    # pending (not failed, not held) and go first on the next run.
    status: Literal["completed", "partial"] = "completed"
    pending: dict[str, int] = {}  # stream → documents left pending (deferred by the budget)
    pending_tokens: int = 0  # their estimated prompt tokens (the backlog's size)
    budget_seconds: float | None = None  # what phase 1 was given (None: no deadline)
    extract_seconds: float = 0.0  # spent on batches (LLM + graph writes): the rate's clock
    endpoints: dict[str, dict[str, Any]] = {}  # base URL → the client's stats (LLMClient.stats)
    quality: AnswerQuality = AnswerQuality()
    # a name alone where the name has namesakes: linked to the one the document's context
    # fits, or to none and listed (tasks/extraction/answers.py)
    namesakes_linked: int = 0
    unlinked_people: list[UnlinkedMention] = []
    # contacts kept apart from their name's Person (another address: a second Person), and the
    # joins written (`graph merges` lists them) by their evidence's kind: e-mail, employer,
    # surname (tasks/extraction/answers.py)
    namesakes_apart: int = 0
    joins: dict[str, int] = {}

    @classmethod
    def empty(cls) -> ExtractionReport:
        """What a run whose phase 1 did not run reports: nothing counted."""
        return cls(documents={}, llm_calls=0, prompt_tokens=0, completion_tokens=0,
                   entities=0, relationships=0, deleted=0, pruned=0, rejected_entity_types={},
                   remapped_relationship_types={}, dropped_fields={}, unusable_answers={},
                   bad_records={}, failures=[], dead_letter=None)
