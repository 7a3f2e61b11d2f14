"""The run's records as pydantic models, one family with one schema-version mechanism (base.py):
the training job's (training.py: the adapter manifest with its job's state machine, the training
result a run hands to the nightly, from this process or from the GPU node), phase 2a's
(corpus.py: the scorecard, the training-pending marker), phase 1's (extraction.py: the
extraction report, its failure rows, the graph's snapshots and ledger), the copies to GCS
(storage.py), the node smoke's (smoke.py) and the run summary with its phase records
(summary.py). This module is the family's one public surface: import records from here.

Every record carries `schema_version` and forbids unknown keys, so a misspelled key fails
where it is written instead of silently missing where it is read. Files are written from the
models (`Record.save`, atomically) and read back into them (`Record.load`): a file written
before records had a `schema_version` (today's shapes), or with an older version a record
migrates (`Record.migrate`: the run summary's version 1 → 2), is migrated on load; a file with
a version this code does not know fails with a message naming the file and both versions.
"""

from tasks.records.base import Record, version_message
from tasks.records.corpus import (
    BucketScore,
    BucketVerdict,
    Scorecard,
    ScorecardSummary,
    SourceShare,
    TrainingMarker,
)
from tasks.records.extraction import (
    AnswerQuality,
    DocumentCounts,
    ExtractionReport,
    FailedDocument,
    GraphSnapshot,
    GraphSummary,
    LedgerEntry,
    SnapshotFailed,
    UnlinkedMention,
    grounded_precision,
)
from tasks.records.smoke import SmokePhase, SmokeResult
from tasks.records.storage import CheckpointCopy, SyncReport, error_text
from tasks.records.summary import (
    V1_ALWAYS_WRITTEN,
    V1_EXTRACTION_FIELDS,
    CapacityReport,
    CostSummary,
    NightlyRunSeen,
    NodeUsage,
    PhaseRecord,
    PhaseStatus,
    ReaperResult,
    ReconciledManifest,
    RunStatus,
    RunSummary,
    StaleNodeRun,
    ZoneSpan,
)
from tasks.records.training import (
    FINAL,
    STATES,
    TRANSITIONS,
    AdapterManifest,
    BaseRef,
    Checkpoint,
    GateRecord,
    JobState,
    NodeRun,
    Owner,
    Pairs,
    PastPromotion,
    PromotedPointer,
    Promotion,
    PublishResult,
    TrainingResult,
    check_transition,
)

__all__ = [
    "AdapterManifest",
    "AnswerQuality",
    "BaseRef",
    "BucketScore",
    "BucketVerdict",
    "CapacityReport",
    "Checkpoint",
    "CheckpointCopy",
    "CostSummary",
    "DocumentCounts",
    "ExtractionReport",
    "FailedDocument",
    "FINAL",
    "GateRecord",
    "GraphSnapshot",
    "GraphSummary",
    "LedgerEntry",
    "JobState",
    "NightlyRunSeen",
    "NodeRun",
    "NodeUsage",
    "Owner",
    "Pairs",
    "PhaseRecord",
    "PhaseStatus",
    "PastPromotion",
    "Promotion",
    "PromotedPointer",
    "PublishResult",
    "ReaperResult",
    "ReconciledManifest",
    "Record",
    "RunStatus",
    "RunSummary",
    "STATES",
    "SmokePhase",
    "SmokeResult",
    "SnapshotFailed",
    "Scorecard",
    "ScorecardSummary",
    "SourceShare",
    "StaleNodeRun",
    "SyncReport",
    "TRANSITIONS",
    "TrainingMarker",
    "TrainingResult",
    "UnlinkedMention",
    "V1_ALWAYS_WRITTEN",
    "error_text",
    "ZoneSpan",
    "V1_EXTRACTION_FIELDS",
    "check_transition",
    "grounded_precision",
    "version_message",
]
