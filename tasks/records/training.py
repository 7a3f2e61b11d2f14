"""The training job's records: the adapter manifest (with its job's state machine), the result
a training run hands to the nightly, and what publishing an adapter found."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from tasks.records.base import Record, _Strict
from tasks.shared.errors import IllegalTransition

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


class PastPromotion(_Strict):
    """An adapter a bucket served before: its name and when it stopped."""

    name: str
    until: str


class PromotedPointer(_Strict):
    """<artifacts>/promoted/<bucket>.json: the adapter a bucket's servers load (`current`;
    None: the base model), since when and why, and the ones before it, newest first. Files
    written before this record have the same keys (the empty pointer has only current and
    history)."""

    current: str | None = None
    since: str | None = None
    reason: str | None = None
    history: list[PastPromotion] = []

    def to_json(self) -> str:
        """The file's text (the keys the pointer always had; an empty one has two)."""
        keys = None if self.current or self.since else {"current", "history"}
        return self.model_dump_json(indent=2, include=keys)


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
