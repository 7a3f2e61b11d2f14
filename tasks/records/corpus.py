"""Phase 2a's records: the scorecard, its verdicts, and the training-pending marker."""

from __future__ import annotations

from typing import Any, ClassVar

from tasks.records.base import Record, _Strict
from tasks.records.storage import SyncReport

# --- phase 2a: the scorecard and the training-pending marker -------------------------------

class SourceShare(_Strict):
    source: str
    total: int
    clean: int
    share_of_clean: float


class BucketScore(_Strict):
    """One bucket's score: what `score_bucket` returns and the scorecard JSON holds."""

    bucket: str
    kind: str
    path: str
    raw_lines: int
    total: int
    clean: int
    passed: bool
    reasons: list[str]
    rules: dict[str, int]
    pii_flagged: int
    sources: list[SourceShare] = []
    digest: str = ""


class Scorecard(Record):
    """<state_dir>/scorecards/scorecard-<time>.json and latest.json. `version` is the
    scorecard's rules version (tasks/corpus/scorecard.py SCORECARD_VERSION), not the schema."""

    WRITE_UNSET: ClassVar[bool] = True

    version: int
    corpus: str
    floor: int
    config: dict[str, Any]
    buckets: list[BucketScore]


class TrainingMarker(Record):
    """<state_dir>/training-pending/<bucket>.json: a passing bucket's dataset, waiting for
    training (written after the dataset, atomically; removed once a run consumed it)."""

    WRITE_UNSET: ClassVar[bool] = True

    bucket: str
    kind: str
    clean: int
    corpus_digest: str
    scorecard: str
    dataset: str
    time: str


class BucketVerdict(_Strict):
    passed: bool
    clean: int
    total: int
    reasons: list[str]


class ScorecardSummary(_Strict):
    """What the scorecard flow returns and the run summary keeps of it."""

    floor: int
    buckets: dict[str, BucketVerdict]
    scorecard: str
    training_pending: list[str]
    gcs_sync: SyncReport | None = None
