"""The training job's hand-off to the node: a run's parameters from the profile's recipe, and the
train flow run on the node through its deployment (`[training] node_deployment`, on the node's
work pool) — the nightly's and the smoke's one way to hand a dataset to the node. (Training in
this process is the nightly flow's own call of the train flow: flows/nightly.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger

from tasks.compute.node import Watch, run_on_node
from tasks.records import TrainingResult
from tasks.shared.files import file_sha256
from tasks.shared.gcs_sync import upload_file
from tasks.training.params import TrainParams, build_params

if TYPE_CHECKING:
    from tasks.profile import Profile

def train_params(cfg: Profile, profile: str, fields: dict[str, Any]) -> TrainParams:
    """A run's parameters from the profile's recipe, on the node's base model unless the
    profile names one."""
    return build_params(cfg.training.recipe, {
        **fields, "base_model": cfg.training.base_model or cfg.node.base_model},
        where=f"profile {profile} [training]")


def train_on_node(cfg: Profile, profile: str, params: TrainParams, timeout_seconds: float, *,
                  label: str, **flags: Any) -> TrainingResult:
    """Run the train flow on the node through its deployment; `flags` are the flow's other
    parameters (created_by, retrain, promote). With a bucket the node reads the dataset from
    GCS, not from this disk."""
    parameters: dict[str, Any] = {"params": params.model_dump(mode="json"),
                                  "profile": profile, **flags}
    if cfg.training.gcs_block:
        dataset = Path(params.dataset)
        key = f"datasets/{params.bucket}/{dataset.name}"
        url = upload_file(cfg.training.gcs_block, dataset, key)
        get_run_logger().info("dataset for the node uploaded to %s", url)
        parameters.update(dataset_gcs_key=key, dataset_sha256=file_sha256(dataset))
    return run_on_node(cfg.node, cfg.training.node_deployment, parameters, timeout_seconds,
                       label=label, watch=Watch(pickup_seconds=cfg.training.node_pickup_seconds))
