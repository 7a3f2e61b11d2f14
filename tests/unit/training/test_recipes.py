"""Recipes in TRL's and PEFT's words: the shipped recipes build exactly the training
configuration they built before the keys were renamed (values copied from the old recipes:
batch_size → per_device_train_batch_size, checkpoint_every → save_steps, dpo_beta → beta, …),
and a wrong key fails at load time naming the file, the key and the nearest valid names.

One import of TRL (~10 s) for the whole module: building SFTConfig is the validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tasks.shared.errors import ConfigError
from tasks.training.params import LLAMA_TARGETS, RECIPE_DIR, TrainParams, build_params, resolve

ROOT = Path(__file__).resolve().parents[3]
ASKED = ("max_steps", "num_train_epochs", "learning_rate", "per_device_train_batch_size",
         "per_device_eval_batch_size", "gradient_accumulation_steps", "activation_checkpointing",
         "gradient_checkpointing", "logging_steps", "save_strategy", "save_steps",
         "save_total_limit", "eval_strategy", "eval_steps", "max_length", "seed", "warmup_steps",
         "use_cpu", "bf16", "report_to", "disable_tqdm", "dataloader_num_workers")
SFT_ONLY = ("packing", "packing_strategy", "completion_only_loss")


def built(recipe: str, method: str, **fields: Any) -> tuple[dict[str, Any], Any, Any]:
    params = build_params(recipe, {"dataset": "x.parquet", "method": method, **fields})
    r = resolve(params)
    cfg = r.trl_config("/ckpt", cuda=False).to_dict()
    keys = ASKED + (SFT_ONLY if method == "sft" else ("beta",))
    return {k: cfg[k] for k in keys}, r.lora_config(), r.project


CPU = {"seed": 42, "warmup_steps": 0, "use_cpu": True, "bf16": False, "report_to": [],
       "disable_tqdm": True, "dataloader_num_workers": 0, "save_strategy": "steps",
       "save_total_limit": 2}
LOCAL = {**CPU, "num_train_epochs": 1.0, "per_device_train_batch_size": 2,
         "per_device_eval_batch_size": 2, "gradient_accumulation_steps": 1,
         "activation_checkpointing": False, "gradient_checkpointing": False, "logging_steps": 2,
         "save_steps": 10, "eval_strategy": "no", "eval_steps": None}
PRODUCTION = {**CPU, "max_steps": -1, "num_train_epochs": 1.0, "per_device_train_batch_size": 1,
              "per_device_eval_batch_size": 1, "gradient_accumulation_steps": 16,
              "activation_checkpointing": True, "gradient_checkpointing": True,
              "logging_steps": 10, "save_steps": 50, "eval_strategy": "steps", "eval_steps": 100,
              "max_length": 2048}


@pytest.mark.parametrize("recipe, method, want", [
    ("local", "sft", {**LOCAL, "max_steps": 12, "learning_rate": 0.003, "max_length": 256,
                      "packing": False, "packing_strategy": "bfd", "completion_only_loss": True}),
    ("local", "dpo", {**LOCAL, "max_steps": 4, "learning_rate": 0.0005, "max_length": 192,
                      "beta": 0.1}),
    ("production", "sft", {**PRODUCTION, "learning_rate": 0.0002, "packing": True,
                           "packing_strategy": "bfd", "completion_only_loss": True}),
    ("production", "dpo", {**PRODUCTION, "learning_rate": 0.000005, "beta": 0.1}),
])
def test_shipped_recipes_build_the_configs_they_always_built(recipe: str, method: str,
                                                             want: dict[str, Any]) -> None:
    trl, lora, project = built(recipe, method)
    assert trl == want
    r, alpha, dropout = (8, 16, 0.0) if recipe == "local" else (16, 32, 0.05)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout, lora.task_type) == (r, alpha, dropout,
                                                                            "CAUSAL_LM")
    assert lora.target_modules == set(LLAMA_TARGETS)
    if recipe == "local":
        assert project.model_dump() == {
            "base_model": "", "base_gguf": "", "load_in_4bit": False, "export_gguf": True,
            "verify_prompts": ["What did the team decide about the schedule?",
                               "Who should follow up with the customer?"],
            "required_free_gpu_mib": 0, "max_eval_rows": 8, "verify_device": "auto",
            "base_config": ""}
    else:
        assert project.model_dump(exclude={"verify_prompts"}) == {
            "base_model": "allenai/Olmo-3-7B-Think@main",
            "base_gguf": "/opt/models/olmo-3-7b-think-f16.gguf", "load_in_4bit": True,
            "export_gguf": True, "required_free_gpu_mib": 20000, "max_eval_rows": 256,
            "verify_device": "cuda", "base_config": "models/olmo-3-7b-think.config.json"}


def test_overrides_win_over_the_recipe() -> None:
    trl, lora, project = built("local", "sft", max_steps=3, base_model="/m",
                               peft={"r": 4})
    assert (trl["max_steps"], lora.r, lora.lora_alpha, project.base_model) == (3, 4, 16, "/m")


def write(tmp: Path, data: dict[str, Any]) -> Path:
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("data, method, message", [
    ({"per_device_train_batchsize": 2}, "sft",
     r"r\.yaml: unknown key `per_device_train_batchsize` .*nearest valid names: "
     r"per_device_train_batch_size"),
    ({"batch_size": 2}, "sft", r"unknown key `batch_size` .*renamed: use "
                               r"per_device_train_batch_size"),
    ({"dpo": {"betta": 0.2}}, "sft", r"dpo: unknown key `betta` .*nearest valid names: beta"),
    ({"packing": True}, "dpo", r"`packing` is a SFTConfig field only — move it under `sft:`"),
    ({"peft": {"lora_alfa": 8}}, "sft", r"peft: unknown key `lora_alfa` .*lora_alpha"),
    ({"peft": {"r": 0}}, "sft", r"peft: r must be a positive integer \(got 0\)"),
    ({"output_dir": "/x"}, "sft", r"`output_dir` is set by the project"),
    ({"sft": {"gradient_checkpointing": False}}, "sft",
     r"sft: `gradient_checkpointing` is a deprecated alias .* write `activation_checkpointing`"),
    ({"peft": {"task_type": "SEQ_CLS"}}, "sft", r"peft: `task_type` is set by the project"),
    ({"learning_rate": "fast"}, "sft", r"`learning_rate`: 'fast' is not a number"),
    ({"max_eval_rows": 0}, "sft", r"max_eval_rows: Input should be greater than or equal to 1"),
    ({"sft": {"eval_strategy": "sometimes"}}, "sft", r"\(sft\): .*sometimes.* fix the value"),
])
def test_a_bad_key_fails_at_load_naming_the_file_and_the_fix(
        tmp_path: Path, data: dict[str, Any], method: str, message: str) -> None:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError, match=message) as e:
        resolve(build_params(str(path), {"dataset": "x", "method": method}))
    assert str(path) in str(e.value)


def test_method_and_recipe_name_errors() -> None:
    with pytest.raises(ConfigError, match=r"method 'ppo' is not one of \['sft', 'dpo'\]"):
        build_params("local", {"dataset": "x", "method": "ppo"})
    with pytest.raises(ConfigError, match=r"recipe 'nope'.*not found .*\['local', 'production'\]"):
        resolve(build_params("nope", {"dataset": "x", "method": "sft"}))


def test_recipes_resolve_the_same_from_any_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert RECIPE_DIR == ROOT / "recipes"
    path = write(tmp_path, {"sft": {"max_steps": 7}})
    monkeypatch.chdir(tmp_path)
    assert built("local", "sft")[0]["max_steps"] == 12
    assert built(str(path), "sft")[0]["max_steps"] == 7  # an explicit path still works


def test_the_run_digest_follows_what_is_learned() -> None:
    def digest(**over: Any) -> str:
        params = TrainParams(dataset="x", method="sft", recipe="local", overrides=over)
        return resolve(params).digest("data", "bucket")

    same = digest()
    assert digest() == same
    assert digest(verify_prompts=["other"], export_gguf=False) == same  # re-checked, not learned
    assert digest(learning_rate=0.001) != same
    assert digest(peft={"r": 4}) != same
    params = TrainParams(dataset="x", method="sft", recipe="local")
    assert resolve(params).digest("other data", "bucket") != same
