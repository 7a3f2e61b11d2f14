"""The run summary and its parts: phase records, cost, capacity, node usage, what the reaper
and the start's reconciling found."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from tasks.records.base import Record, _Strict
from tasks.records.corpus import ScorecardSummary
from tasks.records.extraction import ExtractionReport
from tasks.records.training import PublishResult, TrainingResult

# --- the run summary -----------------------------------------------------------------------

# "partial": phase 1 ended on its budget with documents left pending for the next run (not a
# failure: phase 2 still runs); a night whose phase 1 was partial and nothing failed is partial.
PhaseStatus = Literal["running", "completed", "partial", "failed", "cancelled", "preempted",
                      "timed_out", "skipped"]
RunStatus = Literal["running", "completed", "partial", "failed", "cancelled", "preempted"]


class PhaseRecord(_Strict):
    status: PhaseStatus
    seconds: float = 0.0
    note: str | None = None


class ZoneSpan(_Strict):
    """A node's most recent RUNNING span in one zone this run, and its cost (GCE:
    tasks/compute/gce/cost.py zone_usage)."""

    running_seconds: float
    provisioning: Literal["spot", "on-demand"]
    usd_per_hour: float
    estimated_usd: float
    status: str  # the instance's status when it was read (RUNNING, TERMINATED, …)


class CostSummary(_Strict):
    tokens_in: int
    tokens_out: int
    gpu_hours: float | None = None
    running_seconds: float | None = None
    estimated_usd: float | None = None
    rates: list[str] | None = None
    zones: dict[str, ZoneSpan] | None = None
    note: str | None = None


class CapacityReport(_Strict):
    """Tonight's phase-1 rates and what the backlog left takes (tasks/extraction/capacity.py)."""

    nodes: int  # nodes phase 1 ran on tonight
    phase1_seconds: float  # the time phase 1 spent extracting: the rates' clock
    phase1_budget_seconds: float | None  # one night's phase-1 budget (None: none was given)
    documents_per_hour: float
    output_tokens_per_hour: int
    prompt_tokens_per_hour: int
    backlog_documents: int  # pending after tonight (deferred or never reached)
    backlog_tokens: int  # their estimated prompt tokens
    backlog_output_tokens: int | None  # at tonight's output tokens per document
    nights_to_clear: int | None  # None: no estimate (see note)
    nodes_to_clear_in_one_night: int | None
    note: str | None = None


# Version 1 of the run summary copied these fields of phase 1's report to its top level;
# version 2 holds the report whole, as `extraction`.
V1_EXTRACTION_FIELDS = ("documents", "llm_calls", "prompt_tokens", "completion_tokens",
                        "entities", "relationships", "failures", "graph", "dead_letter",
                        "deleted", "pruned", "rejected_entity_types",
                        "remapped_relationship_types", "unusable_answers", "dropped_fields",
                        "bad_records", "pending", "quality")
# … and wrote these (zeros) from the start, whether phase 1 ran or not (tasks/night/summary.py)
V1_ALWAYS_WRITTEN = frozenset({"documents", "llm_calls", "prompt_tokens", "completion_tokens",
                               "entities", "relationships", "failures"})


def _extraction_held(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 summary's flat extraction fields as the report they were copied from (none
    when phase 1 never reported: only the zeros every summary started with)."""
    flat = {k: data.pop(k) for k in V1_EXTRACTION_FIELDS if k in data}
    if set(flat) - V1_ALWAYS_WRITTEN:
        data["extraction"] = flat
    return data


class NodeUsage(_Strict):
    """What a node ran and cost this run (Node.usage; GCE: tasks/compute/cost.py)."""

    running_seconds: float
    gpu_hours: float
    estimated_usd: float
    zones: dict[str, ZoneSpan] = {}  # where → its span
    note: str = ""


class NightlyRunSeen(_Strict):
    """A nightly flow run the reaper found in the Prefect API."""

    id: str
    name: str
    state: str | None
    start_time: str | None
    age_seconds: float


class ReaperResult(_Strict):
    """What the reaper found and did (tasks/night/reaper.py reap)."""

    profile: str | None = None  # None: the reaper at the start failed (see error)
    nightly_slot_held: bool | None = None
    active_runs: list[NightlyRunSeen] = []
    orphaned_runs: list[NightlyRunSeen] = []
    stale_runs: list[NightlyRunSeen] = []
    # where → status of what was up (summaries before the fleet of nodes wrote it as text)
    found: dict[str, str] | str | None = None
    stopped_zones: list[str] | None = None
    action: Literal["skipped", "none", "stopped", "error"] | None = None
    reason: str | None = None
    error: str | None = None  # the nightly's reaper at start failed: why


class ReconciledManifest(_Strict):
    """A training manifest found unfinished for a run that is gone, marked at the start
    (tasks/training/reconcile.py)."""

    name: str
    was: str
    now: str
    reason: str


class StaleNodeRun(_Strict):
    """A train/node run no live nightly owned, cancelled at the start
    (tasks/compute/stale_runs.py); only `error` when the check failed."""

    id: str | None = None
    name: str | None = None
    was: str | None = None
    reason: str | None = None
    error: str | None = None


class RunSummary(Record):
    """<state_dir>/runs/<time>-<run>.json and last-run.json. A key is written once the phase
    that fills it ran (the dump leaves out fields never set), as the files always had it."""

    SCHEMA_VERSION: ClassVar[int] = 2  # 2: phase 1's report held whole, as `extraction`
    WRITE_UNSET: ClassVar[bool] = False

    profile: str
    status: RunStatus = "running"
    started_at: str | None = None
    finished_at: str | None = None
    phases: dict[str, PhaseRecord] = {}
    # phase 1's report (also from a failed phase 1: PhaseFailed.summary); None: it did not report
    extraction: ExtractionReport | None = None
    reaper: ReaperResult | None = None  # the reaper at the start (tasks/night/reaper.py)
    reconciled: list[ReconciledManifest] | None = None
    stale_node_runs: list[StaleNodeRun] | None = None
    node: str | None = None
    night_budget_seconds: float | None = None  # one deadline for boot, readiness, both phases
    serving_adapter: str | None = None  # unset: the server was not started; None: base model
    serving_note: str | None = None  # why tonight's server serves the base model, or the names
    published: dict[str, PublishResult] | None = None  # bucket → the serving endpoint's answer
    scorecard: ScorecardSummary | None = None
    training: dict[str, TrainingResult] | None = None
    cost: CostSummary | None = None
    capacity: CapacityReport | None = None  # phase 1's rates and the backlog (tasks/extraction/capacity.py)
    error: str | None = None

    @classmethod
    def migrate_unversioned(cls, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("graph") == {}:  # the old summary started with an empty graph block
            del data["graph"]
        return _extraction_held(data)

    @classmethod
    def migrate(cls, data: dict[str, Any], found: Any) -> dict[str, Any]:
        if found == 1:
            return _extraction_held(data)
        return super().migrate(data, found)

    def merge_extraction(self, phase1: ExtractionReport | None) -> None:
        """Hold phase 1's report (also from a failed phase 1: PhaseFailed.report; None: it
        counted nothing)."""
        if phase1 is not None:
            self.extraction = phase1

    def set_phase(self, name: str, status: PhaseStatus, seconds: float = 0.0,
                  note: str | None = None) -> PhaseRecord:
        record = PhaseRecord(status=status, seconds=seconds) if note is None else \
            PhaseRecord(status=status, seconds=seconds, note=note)
        self.phases[name] = record
        return record
