"""The run's records as pydantic models: the run summary (with its phase records), the adapter
manifest (with its job's state machine), the training-pending marker, the scorecard, and the
training result a run hands to the nightly (from this process or from the GPU node).

Every record carries `schema_version` and forbids unknown keys, so a misspelled key fails
where it is written instead of silently missing where it is read. Files are written from the
models (`Record.save`, atomically) and read back into them (`Record.load`): a file written
before records had a `schema_version` (today's shapes), or with an older version a record
migrates (`Record.migrate`: the run summary's version 1 → 2), is migrated on load; a file with
a version this code does not know fails with a message naming the file and both versions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from tasks.errors import IllegalTransition, RecordError, explain_validation
from tasks.files import write_atomic


class _Strict(BaseModel):
    """Unknown keys are errors; assignments are validated like construction."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Record(_Strict):
    """A record with a schema version, written to and read from JSON."""

    SCHEMA_VERSION: ClassVar[int] = 1
    # False: the dump leaves out the fields never set (the run summary: a key appears once
    # its phase wrote it, as in the files written before the models).
    WRITE_UNSET: ClassVar[bool] = True

    schema_version: int = 1

    @model_validator(mode="before")
    @classmethod
    def _check_version(cls, data: Any) -> Any:
        if isinstance(data, dict):
            found = data.get("schema_version")
            if found is None:  # written before records were versioned: today's shape
                data = {**cls.migrate_unversioned(dict(data)), "schema_version": cls.SCHEMA_VERSION}
            elif found != cls.SCHEMA_VERSION:
                data = {**cls.migrate(dict(data), found), "schema_version": cls.SCHEMA_VERSION}
        return data

    @model_validator(mode="after")
    def _version_always_written(self) -> Self:
        self.model_fields_set.add("schema_version")
        return self

    @classmethod
    def migrate_unversioned(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A record written before `schema_version` existed, in the current shape."""
        return data

    @classmethod
    def migrate(cls, data: dict[str, Any], found: Any) -> dict[str, Any]:
        """A record of the older version `found`, in the current shape; RecordError for a
        version this code does not read (a newer one, or one without a migration)."""
        raise RecordError(version_message(cls, found))

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict (what flows return and artifacts carry)."""
        return self.model_dump(mode="json", exclude_unset=not self.WRITE_UNSET)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, exclude_unset=not self.WRITE_UNSET)

    def save(self, path: Path) -> Path:
        write_atomic(path, self.to_json())
        return path

    @classmethod
    def parse(cls, data: Any, where: str) -> Self:
        """Validate a dict (read from `where`: a file, an artifact) into the record."""
        try:
            return cls.model_validate(data)
        except RecordError as e:  # a version this code does not read (raised as it is)
            raise RecordError(f"{where}: {e}") from None
        except ValidationError as e:
            raise RecordError(explain_validation(
                e, f"{where}: not a valid {cls.__name__} (schema_version "
                f"{cls.SCHEMA_VERSION}):", "Fix or remove the file; a misspelled key is an "
                "error, not ignored.")) from None

    @classmethod
    def load(cls, path: Path) -> Self:
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise RecordError(f"{path}: not JSON ({e}) — fix or remove the file") from None
        return cls.parse(data, str(path))


def version_message(cls: type[Record], found: Any) -> str:
    return (f"{cls.__name__} schema_version {found!r} found, version {cls.SCHEMA_VERSION} "
            "expected (files without a schema_version are read as today's shape) — written "
            "by another version of slm-nightly: run that version, or move the file away")


# --- the training job ----------------------------------------------------------------------

JobState = Literal["queued", "starting", "preparing", "running", "done", "failed", "cancelled"]
STATES: tuple[JobState, ...] = ("queued", "starting", "preparing", "running", "done", "failed",
                                "cancelled")
FINAL: frozenset[str] = frozenset({"done", "failed", "cancelled"})
# queued: the record exists. starting: the job checks its inputs (dataset splits, base model).
# preparing: it holds the `gpu` slot and loads the weights. running: the trainer steps. Any
# state before a final one can fail or be cancelled; a final state is final.
TRANSITIONS: dict[str, frozenset[str]] = {
    "queued": frozenset({"starting", "failed", "cancelled"}),
    "starting": frozenset({"preparing", "failed", "cancelled"}),
    "preparing": frozenset({"running", "failed", "cancelled"}),
    "running": frozenset({"done", "failed", "cancelled"}),
    "done": frozenset(), "failed": frozenset(), "cancelled": frozenset(),
}


def check_transition(name: str, old: str, new: str) -> None:
    if new not in TRANSITIONS.get(old, frozenset()):
        allowed = ", ".join(sorted(TRANSITIONS.get(old, ()))) or "none: it is final"
        raise IllegalTransition(f"adapter {name}: job state {old} → {new} is not a legal "
                                f"transition (from {old}: {allowed})")


class BaseRef(_Strict):
    spec: str
    hf_dir: str | None = None
    gguf: str | None = None
    # tasks/training/base_model.gguf_digest of `gguf`: what a server compares with the GGUF it
    # serves before it loads the adapter (a path alone says nothing once the file is replaced)
    gguf_digest: str | None = None


class Pairs(_Strict):
    train: int
    eval: int


class Checkpoint(_Strict):
    step: int
    path: str


class Owner(_Strict):
    """The process a job ran in, so a later run can tell a killed job from a live one when the
    Prefect API cannot (a kill -9 leaves the flow run `Running` until a lease or heartbeat
    service notices). `started`: the process's start time in clock ticks since boot
    (/proc/<pid>/stat field 22), so a reused pid is not mistaken for the job."""

    host: str
    pid: int
    started: int | None = None


class GateRecord(_Strict):
    passed: bool
    reason: str
    margin: float
    eval_loss: dict[str, float]
    against: str


class Promotion(_Strict):
    at: str
    reason: str


class AdapterManifest(Record):
    """<artifacts>/adapters/<name>/manifest.json: one training job and the adapter it made.
    `state` moves only along TRANSITIONS; assigning an illegal one raises IllegalTransition."""

    WRITE_UNSET: ClassVar[bool] = True

    name: str
    bucket: str
    method: str
    base: BaseRef
    data_digest: str
    run_digest: str
    dataset: str
    params: dict[str, Any]  # the training parameters as the run resolved them
    state: JobState = "queued"
    step: int = 0
    steps: int | None = None
    loss: float | None = None
    eval_loss: float | None = None
    message: str = ""
    peak_mib: float | None = None
    created: str
    started: str | None = None
    finished: str | None = None
    created_by: str
    flow_run_id: str = ""
    owner: Owner | None = None
    verified: bool | None = None
    promoted: bool = False
    pairs: Pairs | None = None
    device: dict[str, Any] | None = None
    checkpoint: Checkpoint | None = None
    training: dict[str, Any] | None = None  # the trainer's report (tasks/training/train.py)
    export: dict[str, Any] | None = None    # the GGUF export's report
    files: dict[str, str] | None = None
    gate: GateRecord | None = None
    promotions: list[Promotion] = []
    mirror: dict[str, Any] | None = None  # the one-way GCS mirror's report, in manifests
    # written before GCS became the store's truth (kept so that they load)
    reused: bool | None = None  # set on what a run returns when it reused a finished adapter

    @classmethod
    def migrate_unversioned(cls, data: dict[str, Any]) -> dict[str, Any]:
        data.pop("version", None)  # the manifests' own format number (1) before schema_version
        return data

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "state" and value != self.state:
            check_transition(self.name, self.state, value)
        super().__setattr__(key, value)

    def advance(self, state: JobState, **fields: Any) -> None:
        """Move the job to `state` (checked) and set other fields with it."""
        self.state = state
        for k, v in fields.items():
            setattr(self, k, v)


# --- the result a training run hands to the nightly ----------------------------------------

class NodeRun(_Strict):
    id: str
    name: str


class TrainingResult(Record):
    """What the nightly keeps of one bucket's training: the run's result row (published as the
    `node-result` table artifact, so it also crosses from the GPU node), or why it did not run."""

    WRITE_UNSET: ClassVar[bool] = False

    name: str | None = None
    bucket: str | None = None
    state: str
    step: int | None = None
    steps: int | None = None
    loss: float | None = None
    eval_loss: float | None = None
    verified: bool | None = None
    promoted: bool | None = None
    peak_mib: float | None = None
    reused: bool | None = None
    dataset: str | None = None
    flow_run_id: str | None = None
    gate: str | None = None
    message: str | None = None
    seconds: float | None = None
    node_run: NodeRun | None = None

    @classmethod
    def of_manifest(cls, m: AdapterManifest) -> TrainingResult:
        return cls(name=m.name, bucket=m.bucket, state=m.state, step=m.step, steps=m.steps,
                   loss=m.loss, eval_loss=m.eval_loss, verified=m.verified,
                   promoted=m.promoted, peak_mib=m.peak_mib, reused=m.reused,
                   dataset=m.dataset, flow_run_id=m.flow_run_id,
                   gate=m.gate.reason if m.gate else None)


class PublishResult(_Strict):
    """One bucket's promoted adapter on the configured serving endpoint (tasks/training/
    serving.py publish): loaded under the bucket's name and answering by it, or why not."""

    name: str  # the stable name clients ask for (the bucket's)
    state: Literal["served", "failed", "skipped", "withdrawn"]
    adapter: str | None = None  # the promoted adapter behind the name
    base: str | None = None  # the base it applies to (its manifest's base spec)
    endpoint: str | None = None
    lora_path: str | None = None  # the adapter as the server sees it
    loaded: bool = False  # this run told the server to load it (False: it already had it)
    answered: bool = False  # a chat completion with model=<name> answered
    message: str = ""


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


class DocumentCounts(_Strict):
    seen: int = 0
    extracted: int = 0
    skipped: int = 0
    failed: int = 0


class GraphSummary(_Strict):
    location: str | None = None
    description: str | None = None
    nodes: dict[str, int] = {}
    relationships: dict[str, int] = {}
    check: str | None = None
    snapshot: dict[str, Any] | None = None  # tasks/graph/snapshots.py keep_snapshot's record


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
    gcs_sync: dict[str, Any] | None = None


class CostSummary(_Strict):
    tokens_in: int
    tokens_out: int
    gpu_hours: float | None = None
    running_seconds: float | None = None
    estimated_usd: float | None = None
    rates: list[str] | None = None
    zones: dict[str, Any] | None = None
    note: str | None = None


class CapacityReport(_Strict):
    """Tonight's phase-1 rates and what the backlog left takes (tasks/capacity.py)."""

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


def grounded_precision(grounded: int, ungrounded: int) -> float | None:
    """The share of names the model wrote that occur in their chunk's text; None when it
    wrote none (no figure rests on nothing)."""
    total = grounded + ungrounded
    return round(grounded / total, 4) if total else None


class AnswerQuality(_Strict):
    """How the night's answers kept to the graph schema and to their text, with no gold: the
    production model's quality, measured every night (tasks/extraction/extract.py)."""

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
    failures: list[dict[str, Any]]  # tasks/extraction/extract.py failure_record rows
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

    @classmethod
    def empty(cls) -> ExtractionReport:
        """What a run whose phase 1 did not run reports: nothing counted."""
        return cls(documents={}, llm_calls=0, prompt_tokens=0, completion_tokens=0,
                   entities=0, relationships=0, deleted=0, pruned=0, rejected_entity_types={},
                   remapped_relationship_types={}, dropped_fields={}, unusable_answers={},
                   bad_records={}, failures=[], dead_letter=None)


# Version 1 of the run summary copied these fields of phase 1's report to its top level;
# version 2 holds the report whole, as `extraction`.
V1_EXTRACTION_FIELDS = ("documents", "llm_calls", "prompt_tokens", "completion_tokens",
                        "entities", "relationships", "failures", "graph", "dead_letter",
                        "deleted", "pruned", "rejected_entity_types",
                        "remapped_relationship_types", "unusable_answers", "dropped_fields",
                        "bad_records", "pending", "quality")
# … and wrote these (zeros) from the start, whether phase 1 ran or not (tasks/summary.py)
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
    zones: dict[str, dict[str, Any]] = {}  # where → its span: running_seconds, provisioning, …
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
    capacity: CapacityReport | None = None  # phase 1's rates and the backlog (tasks/capacity.py)
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

    def merge_extraction(self, phase1: ExtractionReport | dict[str, Any]) -> None:
        """Hold phase 1's report (also from a failed phase 1: PhaseFailed.summary, where an
        empty dict says it counted nothing)."""
        if isinstance(phase1, dict):
            if not phase1:
                return
            phase1 = ExtractionReport.model_validate(phase1)
        self.extraction = phase1

    def set_phase(self, name: str, status: PhaseStatus, seconds: float = 0.0,
                  note: str | None = None) -> PhaseRecord:
        record = PhaseRecord(status=status, seconds=seconds) if note is None else \
            PhaseRecord(status=status, seconds=seconds, note=note)
        self.phases[name] = record
        return record
