"""One training job, stage by stage: the dataset, reuse by digest, the manifest's states,
the checks before the `gpu` slot, the trainer under it, export and verification, the gate and
the promotion. The `train` flow (flows/train.py) calls these in order; every stage writes the
manifest, so a reader (the CLI, the nightly, a later run's reconcile) sees how far it got.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event
from prefect.exceptions import Abort, CancelledRun, TerminationSignal
from prefect.runtime import flow_run as current_run

from tasks.compute.node import NODE_RESULT_KEY
from tasks.records import (
    FINAL,
    AdapterManifest,
    BaseRef,
    Checkpoint,
    GateRecord,
    Pairs,
    TrainingResult,
)
from tasks.shared.environment import describe, record
from tasks.shared.errors import ConfigError
from tasks.shared.files import file_sha256, write_atomic
from tasks.shared.gcs_sync import download_file
from tasks.shared.slots import gpu_slot
from tasks.training.base_model import f32_gguf, gguf_digest
from tasks.training.convert import export_lora
from tasks.training.params import Recipe, TrainParams
from tasks.training.preflight import node_limits, preflight, require, verify_plan
from tasks.training.reconcile import reconcile_store, this_process
from tasks.training.registry import ArtifactStore, gate, now, pack
from tasks.training.train import (
    Hooks,
    TrainPaths,
    TrainRun,
    device_report,
    load_splits,
    resolve_base_model,
)
from tasks.training.train import train as train_adapter
from tasks.training.verify import AdapterFiles, verify_adapter


def _event(kind: str, name: str, payload: dict[str, Any]) -> None:
    emit_event(f"slm.training.{kind}", resource={"prefect.resource.id": f"slm.adapter.{name}",
                                                 "prefect.resource.name": name},
               payload=payload)


def loss_png(history: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train_pts = [(h["step"], h["loss"]) for h in history if "loss" in h]
    eval_pts = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h]
    if not train_pts and not eval_pts:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    for pts, label in ((train_pts, "train loss"), (eval_pts, "eval loss")):
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


class Reporter:
    """Progress artifact, loss table, manifest and events while the Trainer runs."""

    def __init__(self, store: ArtifactStore, manifest: AdapterManifest, key: str) -> None:
        self.store, self.manifest, self.key = store, manifest, key
        self.rows: list[dict[str, Any]] = []
        self.progress_id: Any = create_progress_artifact(
            0.0, key=f"training-progress-{key}", description=f"Training {manifest.name}")
        self.logger = get_run_logger()
        self.last_write = 0.0

    def hooks(self) -> Hooks:
        return Hooks(on_start=self.on_start, on_log=self.on_log, on_save=self.on_save)

    def on_start(self, total: int) -> None:
        self.manifest.advance("running", steps=total, started=self.manifest.started or now())
        self.store.write_manifest(self.manifest)
        _event("started", self.manifest.name, {"steps": total, "method": self.manifest.method})

    def on_log(self, step: int, total: int, logs: dict[str, float]) -> None:
        row = {"step": step, **{k: round(v, 5) for k, v in logs.items()
                                if k in ("loss", "eval_loss", "learning_rate", "grad_norm",
                                         "tokens_per_second", "peak_mib")}}
        self.rows.append(row)
        m = self.manifest
        m.step, m.steps, m.peak_mib = step, total, logs.get("peak_mib")
        if "loss" in logs:
            m.loss = round(logs["loss"], 5)
        if "eval_loss" in logs:
            m.eval_loss = round(logs["eval_loss"], 5)
        self.store.write_manifest(m)
        update_progress_artifact(self.progress_id, 100.0 * step / max(total, 1))
        create_table_artifact(self.rows, key=f"training-loss-{self.key}",
                              description=f"Loss per logging step, {self.manifest.name}")
        self.logger.info("step %d/%d  %s", step, total,
                         "  ".join(f"{k} {v}" for k, v in row.items() if k != "step"))

    def on_save(self, step: int, path: str) -> None:
        # To GCS (when it is the store's truth) before the manifest names it: another zone
        # resumes from it.
        copied = self.store.save_checkpoint(path)
        if copied and copied.error:
            self.logger.warning("checkpoint not copied to %s (local copy kept): %s",
                                self.store.where, copied.error)
        self.manifest.checkpoint = Checkpoint(step=step, path=path)
        self.store.write_manifest(self.manifest)
        _event("checkpoint", self.manifest.name, {"step": step})
        self.logger.info("checkpoint at step %d: %s", step, path)


@task(name="export-adapter", cache_policy=NO_CACHE)
def export_adapter(peft_dir: Path, hf_dir: Path, out_dir: Path) -> dict[str, Any]:
    """The GGUF LoRA, by llama.cpp's own convert_lora_to_gguf.py, and the PEFT tarball."""
    report = export_lora(peft_dir, hf_dir, out_dir / "adapter.gguf", outtype="f32")
    pack(peft_dir, out_dir / "adapter.tar.gz")
    return report


@task(name="verify-adapter", cache_policy=NO_CACHE)
def verify(files: AdapterFiles, prompts: list[str], cache_dir: Path, n_threads: int = 2,
           device: str = "cpu") -> dict[str, Any]:
    """cpu: exact comparison on an F32 copy of the served base (quantized matmuls differ from
    HF); cuda: on the (F16/BF16) base as it is, on the GPU (tasks/training/verify.py)."""
    if device == "cpu":
        files = replace(files, base_gguf=f32_gguf(files.base_gguf, cache_dir))
    return verify_adapter(files, prompts, n_threads=n_threads, device=device)


def record_environment(gcs_block: str | None) -> None:
    """On the node (a dataset handed over through the bucket): say in the bucket what this
    environment is, for preflight and `node smoke` to compare with the orchestrator's
    (tasks/shared/environment.py). Never fails the run."""
    if not gcs_block:
        return
    logger = get_run_logger()
    try:
        env = describe()
        record(gcs_block, env)
        logger.info("environment %s (Python %s) recorded in the bucket", env["digest"],
                    env["python"])
    except Exception as e:  # noqa: BLE001 - a report, not a step of the training
        logger.warning("could not record the environment: %s: %s", type(e).__name__, e)


def fetch_dataset(block: str | None, key: str, sha256: str | None, state_dir: Path) -> Path:
    """The dataset the nightly uploaded for the node, checked against the scorecard's digest
    (downloaded again only when the local copy does not match)."""
    if not block:
        raise ConfigError(f"dataset_gcs_key {key!r} given but the profile names no GcsBucket "
                          "block — set gcs_block at the top of the profile (or [training] "
                          "gcs_block)")
    local = state_dir / "node-datasets" / key
    if not (local.is_file() and sha256 and file_sha256(local) == sha256):
        download_file(block, key, local)
        get_run_logger().info("dataset fetched from GCS (%s) to %s", key, local)
    if sha256 and file_sha256(local) != sha256:
        raise ConfigError(f"dataset {key} from GCS does not match the scorecard's sha256 "
                          f"{sha256[:12]}… — rerun the nightly (it uploads it again)")
    return local


def dataset_digest(params: TrainParams) -> tuple[Path, str]:
    """The dataset file and its sha256 (what reuse and resumption key on)."""
    dataset = Path(params.dataset)
    if not dataset.is_file():
        raise ConfigError(f"dataset {dataset}: not found — run the scorecard first (a passing "
                          "bucket's dataset is <state_dir>/datasets/<bucket>/<digest>.parquet)")
    return dataset, file_sha256(dataset)


def reconcile(store: ArtifactStore) -> None:
    """Jobs whose run is gone (preempted node, killed process) stop claiming to run."""
    logger = get_run_logger()
    for r in reconcile_store(store, current_flow_run=str(current_run.get_id() or "")):
        logger.warning("adapter %s: %s → %s (%s)", r.name, r.was, r.now, r.reason)


def reuse_or_resume(store: ArtifactStore, bucket: str, run_digest: str,
                    retrain: bool) -> AdapterManifest | None:
    """The finished adapter of the same data and parameters (nothing new to learn), else None
    after readying the checkpoints: dropped for `retrain` (step 0), else restored from the
    store (a node in another zone got this far)."""
    logger = get_run_logger()
    done = [m for m in store.list(bucket) if m.run_digest == run_digest and m.state == "done"]
    if done and not retrain:
        m = done[-1]
        logger.info("%s: already trained on this data with these parameters (%s) — reused; "
                    "pass retrain=True to train again", bucket, m.name)
        m.reused = True  # on what this run returns, not on the stored manifest
        return m
    if retrain:
        store.drop_checkpoints(run_digest)
    elif restored := store.restore(run_digest):
        logger.info("%s restored from %s", restored, store.where)
    return None


@dataclass
class Inputs:
    """What the checks before the slot found: the splits and where the base model is."""

    splits: tuple[list[dict[str, Any]], list[dict[str, Any]]]
    hf_dir: Path
    base_gguf: Path | None
    verify_device: str
    promoted: AdapterManifest | None
    promoted_peft: Path | None


@dataclass(frozen=True)
class JobData:
    """What a job trains on, and the digests that name it: the bucket, the dataset file and its
    sha256 (dataset_digest), and the run's digest (the data and the recipe's settings:
    Recipe.digest), which its checkpoints are kept under."""

    bucket: str
    dataset: Path
    data_digest: str
    run_digest: str


@dataclass
class TrainingJob:
    """One job's manifest in the store, moved along its states by the stages below."""

    store: ArtifactStore
    recipe: Recipe
    manifest: AdapterManifest

    @property
    def name(self) -> str:
        return self.manifest.name

    @classmethod
    def queue(cls, store: ArtifactStore, recipe: Recipe, params: TrainParams, data: JobData,
              created_by: str) -> TrainingJob:
        """The job's manifest, written `queued`."""
        d = data
        name = f"{d.bucket}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{d.run_digest[:8]}"
        manifest = AdapterManifest(
            name=name, bucket=d.bucket, method=params.method,
            base=BaseRef(spec=recipe.project.base_model or "(served GGUF)"),
            data_digest=d.data_digest, run_digest=d.run_digest, dataset=str(d.dataset),
            params=recipe.settings(),
            state="queued", created=now(), created_by=created_by,
            flow_run_id=str(current_run.get_id() or ""), owner=this_process())
        store.write_manifest(manifest)
        return cls(store, recipe, manifest)

    def check(self, cfg: Any, model_cache: Path) -> Inputs:
        """`starting`: everything that can be wrong, checked before the slot is taken and
        weights load (the splits are loaded once: the trainer gets these rows)."""
        logger = get_run_logger()
        m, project = self.manifest, self.recipe.project
        m.advance("starting")
        self.store.write_manifest(m)
        splits = load_splits(Path(m.dataset), m.method, project.max_eval_rows)
        m.pairs = Pairs(train=len(splits[0]), eval=len(splits[1]))
        # Export architecture, verification memory, base model in the cache: from config files.
        limits = node_limits(cfg)
        verify_device = verify_plan(project.verify_device, limits)
        checks = preflight(self.recipe, limits, model_cache=model_cache)
        for c in checks:  # the details of a passing check: `slm-nightly train preflight`
            if c.status != "ok":
                logger.info("preflight %s", c.line())
        logger.info("preflight: %s", ", ".join(f"{c.name} {c.status}" for c in checks))
        require(checks)
        hf_dir, served_gguf = resolve_base_model(project.base_model, model_cache)
        base_gguf = Path(project.base_gguf) if project.base_gguf else served_gguf
        if base_gguf is not None and not base_gguf.is_file():
            raise ConfigError(f"base_gguf {base_gguf}: not found — fix base_gguf")
        m.base.hf_dir = str(hf_dir)
        m.base.gguf = str(base_gguf) if base_gguf else None
        # what a server compares with the GGUF it serves before loading the adapter
        m.base.gguf_digest = gguf_digest(base_gguf) if base_gguf else None
        promoted = self.store.promoted(m.bucket)
        promoted_peft = self.store.fetch(promoted.name, "peft") if promoted else None
        return Inputs(splits, hf_dir, base_gguf, verify_device, promoted, promoted_peft)

    def train(self, inputs: Inputs) -> TrainRun:
        """`preparing` under the `gpu` slot (device check, weights, data), then `running`;
        the loss history and the trainer's report land in the adapter's folder and manifest."""
        logger = get_run_logger()
        m, out_dir = self.manifest, self.store.adapter_dir(self.name)
        train_rows, eval_rows = inputs.splits
        with gpu_slot():
            m.advance("preparing")
            m.device = device = device_report(self.recipe.project.required_free_gpu_mib)
            self.store.write_manifest(m)
            logger.info("training %s: %s on %d pairs (%d held out), device %s", self.name,
                        m.method, len(train_rows), len(eval_rows), device["device"])
            reporter = Reporter(self.store, m, m.bucket)
            # Prefect's own SIGTERM handling stays in place (a cancel is only acked with it):
            # the trainer checkpoints when the termination lands, and it propagates → Cancelled.
            run = train_adapter(self.recipe, inputs.splits, device,
                                TrainPaths(inputs.hf_dir, self.store.checkpoint_dir(m.run_digest),
                                           out_dir, inputs.promoted_peft),
                                reporter.hooks())
        write_atomic(out_dir / "losses.json", json.dumps(run.history, indent=1))
        loss_png(run.history, out_dir / "loss.png", self.name)
        m.step, m.steps = run.steps, run.max_steps
        m.loss, m.eval_loss = run.train_loss, run.eval_loss["new"]
        m.peak_mib, m.training = run.peak_mib, run.report()
        if run.resumed_from:
            logger.info("resumed from %s (step %d)", run.resumed_from, run.resumed_step)
        return run

    def export(self, run: TrainRun, inputs: Inputs, cfg: Any, model_cache: Path) -> None:
        """The GGUF LoRA, verified in llama.cpp against HF+PEFT, and the PEFT tarball; or
        the tarball alone when there is no GGUF to export to."""
        m, project = self.manifest, self.recipe.project
        out_dir, peft_dir = self.store.adapter_dir(self.name), Path(run.peft_dir)
        files = {"peft": "peft", "losses": "losses.json", "loss_curve": "loss.png"}
        if project.export_gguf and inputs.base_gguf is not None:
            m.export = export_adapter(peft_dir, inputs.hf_dir, out_dir)
            report = verify(AdapterFiles(inputs.base_gguf, out_dir / "adapter.gguf",
                                         inputs.hf_dir, peft_dir),
                            project.verify_prompts, model_cache, cfg.node.cpu_threads,
                            inputs.verify_device)
            write_atomic(out_dir / "verify.json", json.dumps(report, indent=1))
            m.verified = True
            files.update(gguf="adapter.gguf", tarball="adapter.tar.gz", verify="verify.json")
        else:
            pack(peft_dir, out_dir / "adapter.tar.gz")
            files["tarball"] = "adapter.tar.gz"
            m.message = ("no GGUF export (export_gguf off or no GGUF base): PEFT "
                         "adapter only, for vLLM")
        m.files = files

    def finish(self) -> None:
        """`done`; the checkpoints go. They exist to resume an interrupted run: kept until
        the run is done (export and verification included), so a failed verification resumes
        at the last step instead of retraining from step 0 the next night."""
        self.manifest.advance("done", finished=now())
        self.store.write_manifest(self.manifest)
        if left := self.store.drop_checkpoints(self.manifest.run_digest):
            # the adapter stands; only space is lost
            get_run_logger().warning("checkpoints of %s not removed from %s: %s", self.name,
                                     self.store.where, left)

    def gate_and_promote(self, run: TrainRun, inputs: Inputs, margin: float,
                         promote: bool) -> None:
        """The gate on held-out loss against what is served; the promotion when it passes
        (and `promote`); the finished event and the run's markdown artifact."""
        logger = get_run_logger()
        ok, why = gate(run.eval_loss, margin)
        self.manifest.gate = GateRecord(
            passed=ok, reason=why, margin=margin, eval_loss=run.eval_loss,
            against=inputs.promoted.name if inputs.promoted else "base model")
        self.store.write_manifest(self.manifest)
        if ok and promote:
            self.store.promote(self.name, why)
            self.manifest = self.store.manifest(self.name)
            self.manifest.promoted = True
            self.store.write_manifest(self.manifest)
            logger.info("promoted %s: %s", self.name, why)
        else:
            logger.info("%s kept, not promoted: %s", self.name,
                        why if not ok else "promote=False")
        _event("finished", self.name, {"state": "done", "promoted": self.manifest.promoted,
                                       "eval_loss": run.eval_loss})
        create_markdown_artifact(markdown(self.manifest), key=f"training-{self.manifest.bucket}",
                                 description=f"Training run {self.name}")

    def fail(self, e: BaseException) -> None:
        """`cancelled` or `failed` with the error's message; a `done` job (its promotion
        failed) keeps its state: the adapter stands."""
        m = self.manifest
        cancelled = isinstance(e, TerminationSignal | CancelledRun | Abort | KeyboardInterrupt)
        message = f"{type(e).__name__}: {e}"[:2000]
        if m.state in FINAL:
            m.message = message
        else:
            m.advance("cancelled" if cancelled else "failed", finished=now(), message=message)
        self.store.write_manifest(m)
        _event("finished", self.name, {"state": m.state, "message": m.message})


def publish_result(m: AdapterManifest) -> None:
    """The run's result as a one-row table artifact: how a run on the GPU node hands its
    result to the nightly on the orchestrator (tasks/compute/node.py: run_on_node)."""
    create_table_artifact([TrainingResult.of_manifest(m).to_dict()], key=NODE_RESULT_KEY,
                          description=f"Training result, {m.name}")


def markdown(m: AdapterManifest) -> str:
    tr = m.training or {}
    pairs = m.pairs.model_dump() if m.pairs else None
    lines = [f"# Training {m.name}: {m.state}", "",
             f"- method {m.method}, bucket {m.bucket}, pairs {pairs}",
             f"- steps {m.step}/{m.steps}, train loss {m.loss}, "
             f"{tr.get('steps_per_second')} steps/s, {tr.get('tokens_per_second')} tokens/s, "
             f"peak {m.peak_mib} MiB ({tr.get('peak_kind')})",
             f"- held-out loss: {m.gate.eval_loss if m.gate else None}",
             f"- verified in llama.cpp: {m.verified}",
             f"- promotion: {'PROMOTED' if m.promoted else 'kept'} — "
             f"{m.gate.reason if m.gate else None}"]
    return "\n".join(lines)
