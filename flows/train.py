"""Phase 2b: train an adapter on one bucket's clean dataset, export it, verify it, register it,
and promote it when it beats what is served today.

Deployable on its own (`prefect deployment run train/ad-hoc -p params='{…}'`) and run by the
nightly for each passing bucket. Every run holds the `gpu` slot while it loads weights, so an
ad-hoc run waits for the nightly (and the other way round).
"""


import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event
from prefect.runtime import flow_run as current_run

from tasks.errors import ConfigError
from tasks.files import file_sha256
from tasks.night.slots import gpu_slot
from tasks.profile import load_profile
from tasks.records import (
    FINAL,
    AdapterManifest,
    BaseRef,
    Checkpoint,
    GateRecord,
    Pairs,
    TrainingResult,
)
from tasks.training.base_model import gguf_digest
from tasks.training.params import TrainParams, resolve
from tasks.training.preflight import node_limits, preflight, require, verify_plan
from tasks.training.reconcile import reconcile_store, this_process
from tasks.training.registry import ArtifactStore, gate, now, pack
from tasks.training.train import (
    Hooks,
    TrainingError,
    device_report,
    load_splits,
    resolve_base_model,
)
from tasks.training.train import train as train_adapter


def _event(kind: str, name: str, payload: dict[str, Any]) -> None:
    emit_event(f"slm.training.{kind}", resource={"prefect.resource.id": f"slm.adapter.{name}",
                                                 "prefect.resource.name": name},
               payload=payload)


def _loss_png(history: list[dict[str, Any]], path: Path, title: str) -> Path | None:
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


class _Reporter:
    """Progress artifact, loss table, manifest and events while the Trainer runs."""

    def __init__(self, store: ArtifactStore, manifest: AdapterManifest, key: str) -> None:
        self.store, self.manifest, self.key = store, manifest, key
        self.rows: list[dict[str, Any]] = []
        self.progress_id: Any = create_progress_artifact(
            0.0, key=f"training-progress-{key}", description=f"Training {manifest.name}")
        self.logger = get_run_logger()
        self.last_write = 0.0

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
        if copied and copied.get("error"):
            self.logger.warning("checkpoint not copied to %s (local copy kept): %s",
                                self.store.where, copied["error"])
        self.manifest.checkpoint = Checkpoint(step=step, path=path)
        self.store.write_manifest(self.manifest)
        _event("checkpoint", self.manifest.name, {"step": step})
        self.logger.info("checkpoint at step %d: %s", step, path)


@task(name="export-adapter", cache_policy=NO_CACHE)
def export_adapter(peft_dir: Path, hf_dir: Path, out_dir: Path) -> dict[str, Any]:
    """The GGUF LoRA, by llama.cpp's own convert_lora_to_gguf.py, and the PEFT tarball."""
    from tasks.training.convert import export_lora

    report = export_lora(peft_dir, hf_dir, out_dir / "adapter.gguf", outtype="f32")
    pack(peft_dir, out_dir / "adapter.tar.gz")
    return report


@task(name="verify-adapter", cache_policy=NO_CACHE)
def verify(base_gguf: Path, adapter_gguf: Path, hf_dir: Path, peft_dir: Path, prompts: list[str],
           cache_dir: Path, n_threads: int = 2, device: str = "cpu") -> dict[str, Any]:
    """cpu: exact comparison on an F32 copy of the served base (quantized matmuls differ from
    HF); cuda: on the (F16/BF16) base as it is, on the GPU (tasks/training/verify.py)."""
    from tasks.training.base_model import f32_gguf
    from tasks.training.verify import verify_adapter

    gguf = f32_gguf(base_gguf, cache_dir) if device == "cpu" else base_gguf
    return verify_adapter(gguf, adapter_gguf, hf_dir, peft_dir, prompts, n_threads=n_threads,
                          device=device)


def _record_environment(gcs_block: str | None, logger: Any) -> None:
    """On the node (a dataset handed over through the bucket): say in the bucket what this
    environment is, for preflight and `node smoke` to compare with the orchestrator's
    (tasks/environment.py). Never fails the run."""
    from tasks.environment import describe, record

    if not gcs_block:
        return
    try:
        env = describe()
        record(gcs_block, env)
        logger.info("environment %s (Python %s) recorded in the bucket", env["digest"],
                    env["python"])
    except Exception as e:  # noqa: BLE001 - a report, not a step of the training
        logger.warning("could not record the environment: %s: %s", type(e).__name__, e)


@flow(name="train")
def train(params: TrainParams, profile: str = "local", promote: bool = True,
          created_by: str = "ad-hoc", retrain: bool = False,
          dataset_gcs_key: str | None = None, dataset_sha256: str | None = None
          ) -> dict[str, Any]:
    """Train → export → verify → register → promote (if the gate passes). Returns the manifest.

    `dataset_gcs_key`: on the GPU node, fetch the dataset from the profile's GcsBucket (the
    nightly uploaded it there) instead of reading `params.dataset`, and check its sha256.
    The recipe is `params.recipe`, else the profile's `[training] recipe`."""
    logger = get_run_logger()
    cfg = load_profile(profile)
    ts = cfg.training
    recipe = resolve(params, ts.recipe, where=f"train ({params.recipe or ts.recipe})")
    if dataset_gcs_key:
        params = params.model_copy(update={"dataset": str(_fetch_dataset(
            ts.gcs_block, dataset_gcs_key, dataset_sha256, cfg.state_dir))})
        _record_environment(ts.gcs_block, logger)
    store = cfg.artifact_store()
    model_cache = Path(ts.model_cache) if ts.model_cache else cfg.state_dir / "models"
    dataset = Path(params.dataset)
    if not dataset.is_file():
        raise ConfigError(f"dataset {dataset}: not found — run the scorecard first (a passing "
                          "bucket's dataset is <state_dir>/datasets/<bucket>/<digest>.parquet)")
    data_digest = file_sha256(dataset)
    # Jobs whose run is gone (preempted node, killed process) stop claiming to run.
    for r in reconcile_store(store, current_flow_run=str(current_run.get_id() or "")):
        logger.warning("adapter %s: %s → %s (%s)", r.name, r.was, r.now, r.reason)
    bucket = params.bucket or params.method
    run_digest = recipe.digest(data_digest, bucket)
    done = [m for m in store.list(bucket) if m.run_digest == run_digest and m.state == "done"]
    if done and not retrain:  # same data, same parameters: nothing new to learn
        m = done[-1]
        logger.info("%s: already trained on this data with these parameters (%s) — reused; "
                    "pass retrain=True to train again", bucket, m.name)
        m.reused = True  # on what this run returns, not on the stored manifest
        _publish_result(m)
        return m.to_dict()
    if retrain:  # start from step 0, not from an earlier run's checkpoints
        store.drop_checkpoints(run_digest)
    elif restored := store.restore(run_digest):  # a node in another zone got this far
        logger.info("%s restored from %s", restored, store.where)
    name = f"{bucket}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{run_digest[:8]}"
    out_dir = store.adapter_dir(name)
    manifest = AdapterManifest(
        name=name, bucket=bucket, method=params.method,
        base=BaseRef(spec=recipe.project.base_model or "(served GGUF)"),
        data_digest=data_digest, run_digest=run_digest, dataset=str(dataset),
        params=recipe.settings(),
        state="queued", created=now(), created_by=created_by,
        flow_run_id=str(current_run.get_id() or ""), owner=this_process())
    store.write_manifest(manifest)
    try:
        manifest.advance("starting")
        store.write_manifest(manifest)
        # Everything that can be wrong is checked before the slot is taken and weights load.
        # Loaded once: `train` gets these rows, and the device report below.
        splits = load_splits(dataset, params.method, recipe.project.max_eval_rows)
        train_rows, eval_rows = splits
        manifest.pairs = Pairs(train=len(train_rows), eval=len(eval_rows))
        # Export architecture, verification memory, base model in the cache: from config files.
        limits = node_limits(cfg)
        verify_device = verify_plan(recipe.project.verify_device, limits)
        checks = preflight(recipe, limits, model_cache=model_cache)
        for check in checks:  # the details of a passing check: `slm-nightly train preflight`
            if check.status != "ok":
                logger.info("preflight %s", check.line())
        logger.info("preflight: %s", ", ".join(f"{c.name} {c.status}" for c in checks))
        require(checks)
        hf_dir, served_gguf = resolve_base_model(recipe.project.base_model, model_cache)
        base_gguf = Path(recipe.project.base_gguf) if recipe.project.base_gguf else served_gguf
        if base_gguf is not None and not base_gguf.is_file():
            raise ConfigError(f"base_gguf {base_gguf}: not found — fix base_gguf")
        manifest.base.hf_dir = str(hf_dir)
        manifest.base.gguf = str(base_gguf) if base_gguf else None
        # what a server compares with the GGUF it serves before loading the adapter
        manifest.base.gguf_digest = gguf_digest(base_gguf) if base_gguf else None
        promoted = store.promoted(bucket)
        promoted_peft = store.fetch(promoted.name, "peft") if promoted else None
        with gpu_slot():
            manifest.advance("preparing")  # the slot is held: device check, weights, data
            manifest.device = device = device_report(recipe.project.required_free_gpu_mib)
            store.write_manifest(manifest)
            logger.info("training %s: %s on %d pairs (%d held out), device %s", name,
                        params.method, len(train_rows), len(eval_rows), device["device"])
            reporter = _Reporter(store, manifest, bucket)
            # Prefect's own SIGTERM handling stays in place (a cancel is only acked with it):
            # the trainer checkpoints when the termination lands, and it propagates → Cancelled.
            result = train_adapter(recipe, splits, device, hf_dir, store.checkpoint_dir(run_digest), out_dir,
                           Hooks(on_start=reporter.on_start, on_log=reporter.on_log,
                                 on_save=reporter.on_save), promoted_peft)
        history = result.pop("history")
        (out_dir / "losses.json").write_text(json.dumps(history, indent=1))
        _loss_png(history, out_dir / "loss.png", name)
        manifest.step, manifest.steps = result["steps"], result["max_steps"]
        manifest.loss, manifest.eval_loss = result["train_loss"], result["eval_loss"]["new"]
        manifest.peak_mib, manifest.training = result["peak_mib"], result
        if result["resumed_from"]:
            logger.info("resumed from %s (step %d)", result["resumed_from"],
                        result["resumed_step"])
        peft_dir = Path(result["peft_dir"])
        files = {"peft": "peft", "losses": "losses.json", "loss_curve": "loss.png"}
        if recipe.project.export_gguf and base_gguf is not None:
            manifest.export = export_adapter(peft_dir, hf_dir, out_dir)
            report = verify(base_gguf, out_dir / "adapter.gguf", hf_dir, peft_dir,
                            recipe.project.verify_prompts, model_cache,
                            cfg.node.cpu_threads, verify_device)
            (out_dir / "verify.json").write_text(json.dumps(report, indent=1))
            manifest.verified = True
            files.update(gguf="adapter.gguf", tarball="adapter.tar.gz", verify="verify.json")
        else:
            pack(peft_dir, out_dir / "adapter.tar.gz")
            files["tarball"] = "adapter.tar.gz"
            manifest.message = ("no GGUF export (export_gguf off or no GGUF base): PEFT "
                                   "adapter only, for vLLM")
        manifest.files = files
        manifest.advance("done", finished=now())
        store.write_manifest(manifest)
        # Checkpoints exist to resume an interrupted run: kept until the run is done (export and
        # verification included), so a failed verification resumes at the last step instead of
        # retraining from step 0 the next night.
        if left := store.drop_checkpoints(run_digest):  # the adapter stands; only space is lost
            logger.warning("checkpoints of %s not removed from %s: %s", name, store.where, left)
        ok, why = gate(result["eval_loss"], ts.promote_margin)
        manifest.gate = GateRecord(passed=ok, reason=why, margin=ts.promote_margin,
                                   eval_loss=result["eval_loss"],
                                   against=promoted.name if promoted else "base model")
        store.write_manifest(manifest)
        if ok and promote:
            store.promote(name, why)
            manifest = store.manifest(name)
            manifest.promoted = True
            store.write_manifest(manifest)
            logger.info("promoted %s: %s", name, why)
        else:
            logger.info("%s kept, not promoted: %s", name,
                        why if not ok else "promote=False")
        _event("finished", name, {"state": "done", "promoted": manifest.promoted,
                                  "eval_loss": result["eval_loss"]})
        create_markdown_artifact(_markdown(manifest), key=f"training-{bucket}",
                                 description=f"Training run {name}")
        _publish_result(manifest)
        return manifest.to_dict()
    except BaseException as e:
        from prefect.exceptions import Abort, CancelledRun, TerminationSignal

        cancelled = isinstance(e, TerminationSignal | CancelledRun | Abort | KeyboardInterrupt)
        message = f"{type(e).__name__}: {e}"[:2000]
        if manifest.state in FINAL:  # done (the promotion failed): the adapter stands
            manifest.message = message
        else:
            manifest.advance("cancelled" if cancelled else "failed", finished=now(),
                             message=message)
        store.write_manifest(manifest)
        _event("finished", name, {"state": manifest.state, "message": manifest.message})
        raise


def result_row(m: AdapterManifest) -> TrainingResult:
    """What the nightly keeps of a training run (the same whether it ran here or on the node)."""
    return TrainingResult.of_manifest(m)


def _publish_result(m: AdapterManifest) -> None:
    """The run's result as a one-row table artifact: how a run on the GPU node hands its
    result to the nightly on the orchestrator (tasks/compute/node.py: run_on_node)."""
    from tasks.compute.node import NODE_RESULT_KEY

    create_table_artifact([result_row(m).to_dict()], key=NODE_RESULT_KEY,
                          description=f"Training result, {m.name}")


def _markdown(m: AdapterManifest) -> str:
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


def _fetch_dataset(block: str | None, key: str, sha256: str | None, state_dir: Path) -> Path:
    from tasks.gcs_sync import download_file

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


__all__ = ["TrainParams", "TrainingError", "train_flow"]


# The flow's old name, kept for the callers that import it. The function carries the flow's
# name because `prefect deploy --name FLOW/DEPLOYMENT` matches a deployment by its entrypoint's
# function name ('-' read as '_'): prefect.yaml's `flows/train.py:train`.
train_flow = train
