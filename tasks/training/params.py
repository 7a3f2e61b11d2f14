"""Training configuration in TRL's and PEFT's own words, plus a few fields of the project's own.

A recipe (recipes/*.yaml) is written the way alignment-handbook writes its recipes: every
training key is a field of TRL's `SFTConfig` / `DPOConfig` under its own name
(`per_device_train_batch_size`, `save_steps`, `beta`, …), the LoRA keys are PEFT `LoraConfig`
fields under `peft:`, and `sft:` / `dpo:` hold what applies to one method. Beside them sit the
project's own fields (`ProjectFields`: which base model, 4-bit or not, GGUF export, the
verification prompts, free GPU memory, held-out rows).

Loading a recipe builds the real `SFTConfig`, `DPOConfig` and `LoraConfig` — for both methods,
whichever one runs — so a misspelled or unknown key fails at once, naming the file, the key and
the nearest valid names, before a weight is loaded.

The flow's parameter (`TrainParams`, a form in Prefect's UI) stays small: the dataset, the
bucket, the method, which recipe, and the recipe keys this run overrides.
"""

# Why not TRL's own `TrlParser`: it reads one flat config for one dataclass set (no `sft:` /
# `dpo:` / `peft:` sections, no project keys), and its errors name neither the file nor the fix:
# with TRL 1.16 an unknown key is "Unknown arguments from config file: ['--betta', '0.2']…", and a
# value of the wrong type ends the process (argparse's usage, exit 2).

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tasks.shared.errors import ConfigError, explain_validation
from tasks.training.offline import import_bitsandbytes_offline

# Found from the code, not the working directory: `slm-nightly` and Prefect workers start anywhere.
RECIPE_DIR = Path(__file__).resolve().parents[2] / "recipes"
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
METHODS = ("sft", "dpo")
SECTIONS = ("description", "peft", *METHODS)

# The project's defaults where they differ from TRL's (TRL's own are for GPU fleets: 3 epochs,
# a checkpoint every 500 steps, learning rate 2e-5 / 1e-6 for full fine-tuning). A recipe
# overrides any of them. `per_device_eval_batch_size`, when unset, follows the train batch.
TRL_DEFAULTS: dict[str, Any] = {
    "num_train_epochs": 1.0, "learning_rate": 2e-4, "per_device_train_batch_size": 4,
    "logging_steps": 5, "save_steps": 50, "save_total_limit": 2,
    # transformers 5 renamed gradient_checkpointing (a deprecated alias now, with a
    # FutureWarning on every config built from it); TRL turns it on by default.
    "activation_checkpointing": True,
}
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    # Prompt-completion rows: the loss covers the assistant's answer only.
    "sft": {"completion_only_loss": True},
    "dpo": {},
}
PEFT_DEFAULTS: dict[str, Any] = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
                                 "target_modules": LLAMA_TARGETS}
# Set by the code from where the run happens; a recipe that sets them is refused.
FIXED_TRL: dict[str, str] = {
    "output_dir": "the checkpoint folder named by the run digest",
    "use_cpu": "the device found at run time", "bf16": "the device found at run time",
    "report_to": "progress goes to Prefect (artifacts, logs), not to trackers",
    "disable_tqdm": "progress bars stay off; the flow logs step, loss and peak memory",
}
FIXED_PEFT: dict[str, str] = {"task_type": "always CAUSAL_LM"}
# Deprecated aliases in transformers 5: next to the project's default for the new name they
# would be silently ignored, so they are refused with the name to write.
ALIASES: dict[str, str] = {"gradient_checkpointing": "activation_checkpointing",
                           "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs"}
# The names the recipes used before they spoke TRL's words: a hint for an old recipe.
OLD_NAMES: dict[str, str] = {
    "batch_size": "per_device_train_batch_size", "gradient_accumulation":
    "gradient_accumulation_steps", "checkpoint_every": "save_steps", "dpo_beta": "beta (under dpo:)",
    "epochs": "num_train_epochs", "eval_steps": "eval_steps with eval_strategy: steps",
    "lora_r": "r (under peft:)", "lora_alpha": "lora_alpha (under peft:)",
    "lora_dropout": "lora_dropout (under peft:)", "target_modules": "target_modules (under peft:)",
}


class ProjectFields(BaseModel):
    """The recipe keys that are the project's own (everything else is TRL's or PEFT's)."""

    model_config = ConfigDict(extra="forbid")

    base_model: str = Field(
        default="",
        description="HF folder, a GGUF file (dequantized once and cached), or 'org/name@revision' "
        "already in the local Hugging Face cache. Empty: the GGUF the local server serves.")
    base_gguf: str = Field(default="", description="GGUF the inference server serves (export "
                           "and verification load the adapter onto it). Empty: base_model if it "
                           "is a GGUF, else no GGUF export.")
    load_in_4bit: bool | None = Field(
        default=None, description="QLoRA (NF4). Empty: on with CUDA, off on CPU (on CPU it "
        "runs, slowly, only when set explicitly).")
    export_gguf: bool = Field(default=True, description="Export the adapter as a GGUF LoRA and "
                              "verify it in llama.cpp (needs a GGUF base).")
    verify_prompts: list[str] = Field(default_factory=lambda: [
        "What did the team decide about the schedule?",
        "Summarise the main risk in one sentence.",
        "Who should follow up with the customer?"], min_length=1,
        description="Prompts llama.cpp + adapter must answer exactly as transformers + PEFT do.")
    required_free_gpu_mib: int = Field(default=0, ge=0,
                                       description="Refuse a card with less free memory.")
    max_eval_rows: int = Field(default=64, ge=1, description="Held-out rows for the eval loss "
                               "the promotion gate compares.")
    verify_device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="Where the adapter is verified against HF+PEFT. cpu: an F32 "
        "copy of base_gguf in llama.cpp and HF in float32 (exact to ~0.01; ~4 bytes a parameter "
        "of RAM: a 7B needs ~31 GiB); cuda: base_gguf as it is (F16/BF16) with every layer on "
        "the GPU and HF in bfloat16 on the GPU (wider tolerance). auto: cuda when the node has a "
        "GPU. Preflight refuses a plan whose memory estimate exceeds the node's.")
    base_config: str = Field(
        default="", description="The base model's config.json, for checks made where its "
        "weights are not (the orchestrator's `slm-nightly train preflight`): a path, relative "
        "to recipes/ unless absolute. Empty: the base model's own.")


RECIPE_MODEL = ProjectFields  # what docs/generate.py documents as the project's recipe keys
PROJECT_KEYS = frozenset(ProjectFields.model_fields)
# Not part of what was learned: changing them re-exports or re-checks, it does not retrain.
NOT_DIGESTED = frozenset({"verify_prompts", "export_gguf", "required_free_gpu_mib",
                          "verify_device", "base_config"})


class TrainParams(BaseModel):
    """One training run, as the flow takes it (and Prefect's UI shows it as a form): the data,
    the recipe, and the recipe keys this run sets differently."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(description="The scorecard's Parquet for one bucket (column `split`).")
    bucket: str = Field(default="", description="Bucket the dataset came from (registry key).")
    method: Literal["sft", "dpo"] = Field(description="sft: engineering tuples; dpo: "
                                          "apprenticeship preference pairs.")
    recipe: str = Field(default="", description="recipes/NAME.yaml (a name) or a path to a "
                        "recipe file. Empty: the profile's [training] recipe.")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Recipe keys for this run, over the recipe's: TRL "
        "field names (max_steps, learning_rate, …), the project's (base_model, …), LoRA fields "
        "under 'peft' ({\"peft\": {\"r\": 8}}).")


@dataclass(frozen=True)
class Recipe:
    """One method's recipe, resolved and validated: the project's fields and the keyword
    arguments of TRL's config and PEFT's `LoraConfig` (the project's defaults included)."""

    source: str  # the recipe file, or "(no recipe file)"
    method: str
    project: ProjectFields
    trl: dict[str, Any] = field(default_factory=dict)
    peft: dict[str, Any] = field(default_factory=dict)

    def trl_config(self, output_dir: Path | str, cuda: bool, bf16: bool = False) -> Any:
        """TRL's `SFTConfig` or `DPOConfig` for this run."""
        return _build_trl(self.method, self.trl, str(output_dir), cuda, bf16)

    def lora_config(self) -> Any:
        """PEFT's `LoraConfig` for this run."""
        import_bitsandbytes_offline()
        from peft import LoraConfig

        return LoraConfig(**self.peft, task_type="CAUSAL_LM")

    @property
    def max_length(self) -> int:
        return int(self.trl.get("max_length") or 1024)

    @property
    def beta(self) -> float:
        return float(self.trl.get("beta", 0.1))

    def settings(self) -> dict[str, Any]:
        """Everything this run was configured with, as JSON (the manifest keeps it)."""
        return {"method": self.method, "recipe": self.source,
                **self.project.model_dump(mode="json"), **self.trl, "peft": dict(self.peft)}

    def digest(self, data_digest: str, bucket: str) -> str:
        """Names the run's checkpoints: same data + same settings → same digest → resume."""
        settings = {k: v for k, v in self.settings().items()
                    if k not in NOT_DIGESTED and k != "recipe"}
        blob = json.dumps({"data": data_digest, "bucket": bucket, **settings}, sort_keys=True,
                          default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --- loading ------------------------------------------------------------------------------------

def recipe_path(ref: str) -> Path:
    """A recipe name (`local` → recipes/local.yaml next to the code) or a path."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        return Path(ref)
    return RECIPE_DIR / f"{ref}.yaml"


def read_recipe(ref: str) -> tuple[Path, dict[str, Any]]:
    """The recipe file's mapping, as written."""
    path = recipe_path(ref)
    if not path.is_file():
        known = sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))
        raise ConfigError(f"recipe {ref!r}: {path.resolve()} not found — pass a path to a .yaml "
                          f"file or one of {known} (in {RECIPE_DIR})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {path}: not valid YAML ({e}) — fix the syntax") from e
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path}: expected a mapping of parameters")
    return path, data


def resolve(params: TrainParams, default_recipe: str | None = None, where: str = "training"
            ) -> Recipe:
    """The run's recipe: the project's defaults, the recipe file (`params.recipe`, else
    `default_recipe`), then `params.overrides`; every method's section is checked, whichever
    one runs."""
    ref = params.recipe or default_recipe or ""
    if ref:
        path, data = read_recipe(ref)
        source = str(path)
    else:
        data, source = {}, "(no recipe file)"
    recipes = {m: _resolve_method(data, params.overrides, m, source, where) for m in METHODS}
    return recipes[params.method]


def build_params(recipe: str | None, fields: dict[str, Any], where: str = "training") -> TrainParams:
    """A validated `TrainParams` from a recipe reference and flat fields: `dataset`, `bucket`,
    `method` go to the parameter, any other key is a recipe override (None values ignored).
    The recipe itself is read and checked once, where the run uses it: `resolve` (the train
    flow; preflight before a night)."""
    given = {k: v for k, v in fields.items() if v is not None}
    method = given.get("method")
    if method not in METHODS:
        raise ConfigError(f"{where}: training method {method!r} is not one of {list(METHODS)} — "
                          "use sft (engineering tuples) or dpo (apprenticeship preference pairs)")
    top = {k: given.pop(k) for k in ("dataset", "bucket", "method") if k in given}
    try:
        params = TrainParams(**top, recipe=recipe or "", overrides=given)
    except ValidationError as e:
        raise ConfigError(explain_validation(
            e, f"{where}: invalid training parameters:",
            "Fix them in the flow's parameters.", root="(parameters)")) from None
    return params


def _resolve_method(data: dict[str, Any], overrides: dict[str, Any], method: str, source: str,
                    where: str) -> Recipe:
    fields = _fields()
    own = fields[method]
    other = fields["dpo" if method == "sft" else "sft"]
    section = data.get(method) or {}
    peft_data = data.get("peft") or {}
    over = dict(overrides)
    over_peft = over.pop("peft", None) or {}
    for name, part in (("peft", peft_data), (method, section), ("overrides' peft", over_peft)):
        if not isinstance(part, dict):
            raise ConfigError(f"recipe {source}: `{name}` must be a mapping of keys, not "
                              f"{type(part).__name__}")

    def check(key: str, context: str, allowed: set[str]) -> None:
        if key in FIXED_TRL:
            raise ConfigError(f"recipe {source}: {context}`{key}` is set by the project "
                              f"({FIXED_TRL[key]}) — remove it")
        if key in ALIASES:
            raise ConfigError(f"recipe {source}: {context}`{key}` is a deprecated alias in "
                              f"transformers 5 — write `{ALIASES[key]}`")
        if key in allowed:
            return
        if key in other and context == "":
            cfg = "SFTConfig" if method == "dpo" else "DPOConfig"
            raise ConfigError(f"recipe {source}: `{key}` is a {cfg} field only — move it under "
                              f"`{'sft' if method == 'dpo' else 'dpo'}:`")
        raise ConfigError(_unknown(source, context, key, allowed))

    trl_keys = own | PROJECT_KEYS
    top = {k: v for k, v in data.items() if k not in SECTIONS}
    for key in top:
        check(key, "", trl_keys)
    for key in section:
        check(key, f"{method}: ", trl_keys)
    for key in over:
        check(key, "overrides: ", trl_keys | other)
    merged = {**TRL_DEFAULTS, **METHOD_DEFAULTS[method], **top, **section,
              **{k: v for k, v in over.items() if k in trl_keys}}
    project_raw = {k: merged.pop(k) for k in list(merged) if k in PROJECT_KEYS}
    try:
        project = ProjectFields(**project_raw)
    except ValidationError as e:
        raise ConfigError(explain_validation(
            e, f"{where}: recipe {source}: invalid project fields:",
            "Fix them in the recipe or the flow's overrides (see recipes/*.yaml).",
            root="(recipe)")) from None
    trl = {k: _coerce(source, k, v, fields["defaults"].get(k)) for k, v in merged.items()}
    trl.setdefault("per_device_eval_batch_size", trl["per_device_train_batch_size"])
    lora_fields = fields["peft"]
    for key in {**peft_data, **over_peft}:
        if key in FIXED_PEFT:
            raise ConfigError(f"recipe {source}: peft: `{key}` is set by the project "
                              f"({FIXED_PEFT[key]}) — remove it")
        if key not in lora_fields:
            raise ConfigError(_unknown(source, "peft: ", key, lora_fields))
    peft = {**PEFT_DEFAULTS, **peft_data, **over_peft}
    recipe = Recipe(source, method, project, trl, peft)
    # The real configs: TRL's and PEFT's own checks, run now rather than after the weights load.
    try:
        recipe.trl_config("/nonexistent/validation-only", cuda=False)
        lora = recipe.lora_config()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: recipe {source} ({method}): {e} — fix the value in the "
                          "recipe or the flow's overrides") from None
    if not (isinstance(lora.r, int) and lora.r > 0):
        raise ConfigError(f"recipe {source}: peft: r must be a positive integer (got "
                          f"{lora.r!r}) — the LoRA rank, e.g. 8 or 16")
    return recipe


def _unknown(source: str, context: str, key: str, allowed: set[str]) -> str:
    hint = OLD_NAMES.get(key)
    near = difflib.get_close_matches(key, sorted(allowed), n=3, cutoff=0.6)
    what = ("a LoraConfig field" if context.endswith("peft: ")
            else "a field of TRL's SFTConfig/DPOConfig or of the project (ProjectFields)")
    return (f"recipe {source}: {context}unknown key `{key}` — not {what}"
            + (f"; renamed: use {hint}" if hint else "")
            + (f"; nearest valid names: {', '.join(near)}" if near else ""))


def _coerce(source: str, key: str, value: Any, default: Any) -> Any:
    """YAML reads `5e-6` as a string; TRL's dataclasses check no types. Numbers where the field
    is a number, or an error naming the key."""
    if isinstance(default, bool) or default is None or isinstance(value, bool):
        return value
    try:
        if isinstance(default, float) and isinstance(value, int | str):
            return float(value)
        if isinstance(default, int) and isinstance(value, str):
            return int(value)
    except ValueError:
        raise ConfigError(f"recipe {source}: `{key}`: {value!r} is not a number — write e.g. "
                          f"{default!r}") from None
    return value


_FIELDS: dict[str, Any] = {}


def _fields() -> dict[str, Any]:
    """Field names of SFTConfig, DPOConfig and LoraConfig, and TRL's defaults (imports TRL once)."""
    if not _FIELDS:
        import_bitsandbytes_offline()
        from peft import LoraConfig
        from trl import DPOConfig, SFTConfig

        def names(cls: Any) -> set[str]:
            return {f.name for f in dataclasses.fields(cls) if f.init}

        defaults = {f.name: f.default for cls in (SFTConfig, DPOConfig)
                    for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        _FIELDS.update(sft=names(SFTConfig), dpo=names(DPOConfig), peft=names(LoraConfig),
                       defaults=defaults)
    return _FIELDS


def _build_trl(method: str, kwargs: dict[str, Any], output_dir: str, cuda: bool, bf16: bool
               ) -> Any:
    import_bitsandbytes_offline()
    from trl import DPOConfig, SFTConfig

    cls = SFTConfig if method == "sft" else DPOConfig
    with warnings.catch_warnings():
        # transformers warns about its own deprecated aliases that TRL sets; nothing to act on.
        warnings.simplefilter("ignore", FutureWarning)
        return cls(**kwargs, output_dir=output_dir, use_cpu=not cuda, bf16=cuda and bf16,
                   report_to=[], disable_tqdm=True)
