"""Phase 2b: train an adapter on one bucket's clean dataset, export it, verify it, register it,
and promote it when it beats what is served today.

Deployable on its own (`prefect deployment run train/ad-hoc -p params='{…}'`) and run by the
nightly for each passing bucket. Every run holds the `gpu` slot while it loads weights, so an
ad-hoc run waits for the nightly (and the other way round).
"""


import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from tasks.compute.node import run_on_node
from tasks.files import file_sha256
from tasks.profile import load_profile
from tasks.records import AdapterManifest, TrainingMarker, TrainingResult
from tasks.training.job import (
    TrainingJob,
    dataset_digest,
    fetch_dataset,
    publish_result,
    reconcile,
    record_environment,
    reuse_or_resume,
)
from tasks.training.params import TrainParams, build_params, resolve
from tasks.training.train import TrainingError


@flow(name="train")
def train(params: TrainParams, profile: str = "local", promote: bool = True,
          created_by: str = "ad-hoc", retrain: bool = False,
          dataset_gcs_key: str | None = None, dataset_sha256: str | None = None
          ) -> AdapterManifest:
    """Train → export → verify → register → promote (if the gate passes). Returns the manifest.

    `dataset_gcs_key`: on the GPU node, fetch the dataset from the profile's GcsBucket (the
    nightly uploaded it there) instead of reading `params.dataset`, and check its sha256.
    The recipe is `params.recipe`, else the profile's `[training] recipe`."""
    cfg = load_profile(profile)
    ts = cfg.training
    recipe = resolve(params, ts.recipe, where=f"train ({params.recipe or ts.recipe})")
    if dataset_gcs_key:
        params = params.model_copy(update={"dataset": str(fetch_dataset(
            ts.gcs_block, dataset_gcs_key, dataset_sha256, cfg.state_dir))})
        record_environment(ts.gcs_block)
    store = cfg.artifact_store()
    model_cache = Path(ts.model_cache) if ts.model_cache else cfg.state_dir / "models"
    dataset, data_digest = dataset_digest(params)
    reconcile(store)
    bucket = params.bucket or params.method
    run_digest = recipe.digest(data_digest, bucket)
    reused = reuse_or_resume(store, bucket, run_digest, retrain)
    if reused is not None:
        publish_result(reused)
        return reused
    job = TrainingJob.queue(store, recipe, params, bucket, dataset, data_digest, run_digest,
                            created_by)
    try:
        inputs = job.check(cfg, model_cache)
        run = job.train(inputs)
        job.export(run, inputs, cfg, model_cache)
        job.finish()
        job.gate_and_promote(run, inputs, ts.promote_margin, promote)
        publish_result(job.manifest)
        return job.manifest
    except BaseException as e:
        job.fail(e)
        raise


def result_row(m: AdapterManifest) -> TrainingResult:
    """What the nightly keeps of a training run (the same whether it ran here or on the node)."""
    return TrainingResult.of_manifest(m)


def run_for_marker(marker: TrainingMarker, profile: str, timeout_seconds: float,
                   retrain: bool = False) -> TrainingResult:
    """The nightly's hand-over: one training-pending marker → one training run, in this
    process (local compute) or on the GCE node through its deployment (`[training]
    node_deployment`, on the node's work pool). Returns the run's result row."""
    cfg = load_profile(profile)
    params = build_params(cfg.training.recipe, {
        "dataset": marker.dataset, "bucket": marker.bucket, "method": marker.kind,
        "base_model": cfg.training.base_model or cfg.node.base_model},
        where=f"profile {profile} [training]")
    started = time.monotonic()
    if cfg.node.remote_training:  # the GPU is on the node: run it there
        parameters: dict[str, Any] = {"params": params.model_dump(mode="json"),
                                      "profile": profile, "created_by": "nightly",
                                      "retrain": retrain}
        if cfg.training.gcs_block:  # the node reads the dataset from GCS, not from this disk
            from tasks.gcs_sync import upload_file

            dataset = Path(params.dataset)
            key = f"datasets/{marker.bucket}/{dataset.name}"
            url = upload_file(cfg.training.gcs_block, dataset, key)
            get_run_logger().info("dataset for the node uploaded to %s", url)
            parameters.update(dataset_gcs_key=key, dataset_sha256=file_sha256(dataset))
        row = run_on_node(cfg.node, cfg.training.node_deployment, parameters,
                          timeout_seconds, label=f"train:{marker.bucket}",
                          pickup_seconds=cfg.training.node_pickup_seconds)
    else:
        row = result_row(AdapterManifest.parse(
            train.with_options(timeout_seconds=timeout_seconds)(
                params=params, profile=profile, created_by="nightly", retrain=retrain),
            "the train flow's result"))
    row.seconds = round(time.monotonic() - started, 1)
    return row


__all__ = ["TrainParams", "TrainingError", "run_for_marker", "train_flow"]


# The flow's old name, kept for the callers that import it. The function carries the flow's
# name because `prefect deploy --name FLOW/DEPLOYMENT` matches a deployment by its entrypoint's
# function name ('-' read as '_'): prefect.yaml's `flows/train.py:train`.
train_flow = train
