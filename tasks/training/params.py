"""Training parameters (one pydantic model) and the checked-in recipes that fill them.

A recipe (recipes/*.yaml) holds the settings shared by both methods plus an `sft:` and a
`dpo:` section; the flow's parameters override the recipe. Everything is validated before a
weight is loaded, so a typo costs a second, not a node-hour.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tasks.errors import ConfigError, explain_validation

RECIPE_DIR = Path("recipes")
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class TrainParams(BaseModel):
    """Everything one training run needs. Digest of (data, these fields) names the run's
    checkpoints, so a re-run with the same data and parameters resumes."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(description="The scorecard's Parquet for one bucket (column `split`).")
    bucket: str = Field(default="", description="Bucket the dataset came from (registry key).")
    method: Literal["sft", "dpo"] = Field(description="sft: engineering tuples; dpo: "
                                          "apprenticeship preference pairs.")
    base_model: str = Field(
        default="",
        description="HF folder, a GGUF file (dequantized once and cached), or 'org/name@revision' "
        "already in the local Hugging Face cache. Empty: the GGUF the local server serves.")
    base_gguf: str = Field(default="", description="GGUF the inference server serves (export "
                           "and verification load the adapter onto it). Empty: base_model if it "
                           "is a GGUF, else no GGUF export.")
    lora_r: int = Field(default=16, gt=0, le=1024, description="LoRA rank.")
    lora_alpha: int = Field(default=32, gt=0)
    lora_dropout: float = Field(default=0.05, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: list(LLAMA_TARGETS), min_length=1)
    load_in_4bit: bool | None = Field(
        default=None, description="QLoRA (NF4). Empty: on with CUDA, off on CPU (on CPU it "
        "runs, slowly, only when set explicitly).")
    max_steps: int = Field(default=-1, ge=-1, description="-1: train for `epochs`.")
    epochs: float = Field(default=1.0, gt=0)
    learning_rate: float = Field(default=2e-4, gt=0, lt=1)
    batch_size: int = Field(default=4, ge=1)
    gradient_accumulation: int = Field(default=1, ge=1)
    max_length: int = Field(default=1024, ge=32, description="Tokens per example (truncated).")
    packing: bool = Field(default=False, description="SFT only: pack examples (bfd).")
    gradient_checkpointing: bool = True
    dpo_beta: float = Field(default=0.1, gt=0)
    warmup_steps: int = Field(default=0, ge=0)
    logging_steps: int = Field(default=5, ge=1)
    eval_steps: int = Field(default=0, ge=0, description="0: evaluate at the end only.")
    checkpoint_every: int = Field(default=50, ge=1, description="Steps between checkpoints.")
    max_eval_rows: int = Field(default=64, ge=1, description="Held-out rows for eval loss.")
    required_free_gpu_mib: int = Field(default=0, ge=0,
                                       description="Refuse a card with less free memory.")
    export_gguf: bool = True
    verify_prompts: list[str] = Field(default_factory=lambda: [
        "What did the team decide about the schedule?",
        "Summarise the main risk in one sentence.",
        "Who should follow up with the customer?"])
    seed: int = 42

    @model_validator(mode="after")
    def _check(self) -> TrainParams:
        if self.packing and self.method == "dpo":
            raise ValueError("packing applies to sft only — set packing: false for dpo")
        return self

    def digest(self, data_digest: str) -> str:
        """Names the run's checkpoints: same data + same parameters → same digest → resume."""
        fields = self.model_dump(exclude={"verify_prompts", "export_gguf", "required_free_gpu_mib",
                                          "dataset"})
        blob = json.dumps({"data": data_digest, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def explain(err: ValidationError, where: str) -> str:
    return explain_validation(err, f"{where}: invalid training parameters:",
                              "Fix them in the recipe or the flow's parameters (see recipes/*.yaml).",
                              root="(parameters)")


def recipe_path(ref: str) -> Path:
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        return Path(ref)
    return RECIPE_DIR / f"{ref}.yaml"


def load_recipe(ref: str, method: str) -> dict[str, Any]:
    """The recipe's fields for one method (common fields, then the method's section)."""
    path = recipe_path(ref)
    if not path.is_file():
        known = sorted(p.stem for p in RECIPE_DIR.glob("*.yaml")) if RECIPE_DIR.is_dir() else []
        raise ConfigError(f"recipe {ref!r}: {path.resolve()} not found — pass a path to a .yaml "
                          f"file or one of {known}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {path}: not valid YAML ({e}) — fix the syntax") from e
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path}: expected a mapping of parameters")
    if method not in ("sft", "dpo"):
        raise ConfigError(f"training method {method!r} is not one of ['dpo', 'sft'] — use sft "
                          "(engineering tuples) or dpo (apprenticeship preference pairs)")
    fields = {k: v for k, v in data.items() if k not in ("sft", "dpo", "description")}
    fields.update(data.get(method) or {})
    return fields


def build_params(recipe: str | None, overrides: dict[str, Any], where: str = "training") -> TrainParams:
    """Recipe fields, then explicit overrides (None values ignored), validated with one clear
    error listing every bad field."""
    method = overrides.get("method")
    fields = load_recipe(recipe, str(method)) if recipe else {}
    fields.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return TrainParams(**fields)
    except ValidationError as e:
        raise ConfigError(explain(e, where)) from None
