"""Phase 2b: train an adapter on one bucket's clean dataset, export it, verify it, register it,
and promote it when it beats what is served today.

Deployable on its own (`prefect deployment run train/ad-hoc -p params='{…}'`) and run by the
nightly for each passing bucket. Every run holds the `gpu` slot while it loads weights, so an
ad-hoc run waits for the nightly (and the other way round).
"""


from pathlib import Path

from prefect import flow

from tasks.profile import load_profile
from tasks.records import AdapterManifest
from tasks.training.job import (
    JobData,
    TrainingJob,
    dataset_digest,
    fetch_dataset,
    publish_result,
    reconcile,
    record_environment,
    reuse_or_resume,
)
from tasks.training.params import TrainParams, resolve
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
    job = TrainingJob.queue(store, recipe, params,
                            JobData(bucket, dataset, data_digest, run_digest), created_by)
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


__all__ = ["TrainParams", "TrainingError", "train"]
