"""Everything that would fail a training run after its GPU hours, checked before a weight loads.

`preflight(recipe, …)` answers, from config files only:
- is the base model where the run will look for it (a GGUF file, an HF folder, or the local
  Hugging Face cache — never the hub);
- can llama.cpp's converter export this base + LoRA (tasks.training.convert);
- does the verification plan fit the node's RAM and GPU memory (tasks.training.memory);
- is the GGUF the adapter is verified on the kind the plan needs (unquantized).

The flow (flows/train.py) runs it before it takes the `gpu` slot and fails at once with every
failing check's reason and numbers; `slm-nightly train preflight` prints the same checks from
any machine — where the weights are not (the orchestrator), the recipe's `base_config` (the
model's config.json, shipped in recipes/models/) stands in for them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.engine.llama_cpp import DIST, default_model_path, llama_cpp_version
from tasks.shared.checks import Check, PreflightFailed, failure, passed, skipped
from tasks.shared.errors import ConfigError
from tasks.training import convert, memory
from tasks.training.base_model import HF_MARKER, hf_cache_entry
from tasks.training.memory import NodeLimits
from tasks.training.params import RECIPE_DIR, Recipe
from tasks.training.train import resolve_base_model

# GGUF general.file_type values (llama.cpp's llama_ftype) the cuda plan can verify on exactly
# enough: all-F32, mostly-F16, mostly-BF16. Quantized types change greedy text by themselves.
UNQUANTIZED_FTYPES = {0: "F32", 1: "F16", 32: "BF16"}


@dataclass(frozen=True)
class BaseInfo:
    config: dict[str, Any] | None
    source: str


def verify_plan(setting: str, limits: NodeLimits) -> str:
    """The verification plan for a `verify_device` setting: auto is cuda when the node has a
    GPU, else cpu."""
    if setting == "auto":
        return "cuda" if limits.vram > 0 else "cpu"
    return setting


def this_machine(ram_gib: float | None = None, vram_gib: float | None = None) -> NodeLimits:
    """This machine's RAM (/proc/meminfo MemTotal) and its first CUDA device's memory (0 when
    there is none), unless given."""
    if ram_gib is not None:
        ram = int(ram_gib * memory.GIB)
    else:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if vram_gib is not None:
        vram = int(vram_gib * memory.GIB)
    else:
        import torch

        vram = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() \
            else 0
    return NodeLimits(ram=ram, vram=vram, source="this machine" if ram_gib is None and
                      vram_gib is None else "the profile's node_ram_gib / node_vram_gib")


def node_limits(profile: Any) -> NodeLimits:
    """The memory of the machine that trains: the profile's [training] node_ram_gib /
    node_vram_gib, else a g2-standard-4 where the node trains remotely (a GCE node) and this
    machine where training runs in this process (local compute)."""
    ts = profile.training
    ram, vram = ts.node_ram_gib, ts.node_vram_gib
    if profile.node.remote_training:
        g2 = memory.G2_STANDARD_4
        if ram is None and vram is None:
            return g2
        return NodeLimits(ram=int(ram * memory.GIB) if ram is not None else g2.ram,
                          vram=int(vram * memory.GIB) if vram is not None else g2.vram,
                          source="the profile's node_ram_gib / node_vram_gib over "
                          "a g2-standard-4")
    return this_machine(ram, vram)


def base_config_path(recipe: Recipe) -> Path | None:
    """The recipe's `base_config`, relative to the recipes folder unless absolute."""
    ref = recipe.project.base_config
    if not ref:
        return None
    path = Path(ref)
    return path if path.is_absolute() else RECIPE_DIR / path


def _gguf_config(path: Path) -> dict[str, Any]:
    """An HF-style config read from a GGUF's metadata only (no tensor data)."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = dict(load_gguf_checkpoint(str(path), return_tensors=False)["config"])
    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type", ""))
    if arch and "architectures" not in config:  # what hf_from_gguf's saved folder will say
        config["architectures"] = [arch]
    return config


def locate_base(spec: str, model_cache: Path | None) -> tuple[Check, BaseInfo]:
    """Whether the base model is here, without loading it; its config.json when it is."""
    if not spec:
        spec = str(default_model_path())
    try:
        if spec.endswith(".gguf"):  # resolving would dequantize it: only look
            if not Path(spec).is_file():
                raise ConfigError(f"base model {spec}: GGUF file not found — fix base_model")
            done = hf_cache_entry(Path(spec), model_cache) if model_cache else None
            if done and (done / HF_MARKER).is_file():  # dequantized before: its config.json
                return (passed("base model", f"{spec} → {done} (dequantized before)"),
                        BaseInfo(memory.load_config(done), str(done / HF_MARKER)))
            # parsing the GGUF's metadata (its whole vocabulary) costs seconds: only once
            return (passed("base model", f"{spec} (GGUF; dequantized once before training)"),
                    BaseInfo(_gguf_config(Path(spec)), f"{spec} metadata"))
        hf_dir, _ = resolve_base_model(spec, model_cache or Path("."))
    except ConfigError as e:
        return failure("base model", str(e)), BaseInfo(None, "")
    return (passed("base model", f"{spec} → {hf_dir}"),
            BaseInfo(memory.load_config(hf_dir), str(hf_dir / "config.json")))


def preflight(recipe: Recipe, limits: NodeLimits, *, model_cache: Path | None = None,
              weights_here: bool = True, base_config: Path | None = None,
              base_gguf: Path | None = None) -> list[Check]:
    """Every check, in order; none loads a weight. `weights_here=False` (the orchestrator): the
    base model and GGUF are on another machine, so their presence is not checked here and the
    model's shape comes from `base_config` (else the recipe's `base_config`)."""
    project = recipe.project
    checks: list[Check] = []
    info = BaseInfo(None, "")
    if weights_here:
        check, info = locate_base(project.base_model, model_cache)
        checks.append(check)
    else:
        checks.append(skipped("base model", f"{project.base_model or '(served GGUF)'} "
                            "is checked on the machine that trains (the weights are not here)"))
    config_file = base_config or base_config_path(recipe)
    if info.config is None and config_file is not None:
        try:
            info = BaseInfo(memory.load_config(config_file), str(config_file))
        except ConfigError as e:
            checks.append(failure("model config", str(e)))
    config = info.config
    if config is None:
        why = ("the base model is missing" if weights_here else
               "no config.json: set base_config in the recipe or pass --base-config")
        for name in ("export", "verification fits"):
            checks.append(skipped(name, why))
        return checks
    checks.append(_params_check(config, info.source))
    # As the flow decides: a GGUF export needs a GGUF base (base_gguf, or a GGUF base_model).
    gguf_base = bool(base_gguf or project.base_gguf or not project.base_model
                     or project.base_model.endswith(".gguf"))
    if not (project.export_gguf and gguf_base):
        why = "export_gguf is off" if not project.export_gguf else "no GGUF base (base_gguf)"
        checks.append(skipped("export", f"{why}: PEFT adapter only"))
        checks.append(skipped("verification fits", "nothing to verify in llama.cpp"))
        return checks
    checks.append(_export_check(config, recipe.peft))
    plan = verify_plan(project.verify_device, limits)
    checks.append(_fit_check(config, recipe, plan, limits))
    gguf = base_gguf or (Path(project.base_gguf) if project.base_gguf else None)
    if gguf is not None:
        checks.append(_gguf_check(gguf, plan, weights_here))
    return checks


def _params_check(config: dict[str, Any], source: str) -> Check:
    try:
        p = memory.param_count(config)
    except ConfigError as e:
        return failure("model shape", str(e))
    return passed("model shape", f"{config.get('model_type')}: {p.total:,} parameters "
                 f"({p.layers} layers, hidden {p.hidden}, vocab {p.vocab}) from {source}")


def _export_check(config: dict[str, Any], lora: dict[str, Any]) -> Check:
    try:
        problems = convert.export_problems(config, lora)
    except ConfigError as e:  # the converters are not installed here
        return failure("export", str(e))
    if problems:
        return failure("export", "; ".join(problems))
    return passed("export", f"{convert.hf_architecture(config)} is registered by llama.cpp's "
                  f"converter ({DIST} {llama_cpp_version()}); the LoRA exports")


def _fit_check(config: dict[str, Any], recipe: Recipe, plan: str, limits: NodeLimits) -> Check:
    targets = recipe.peft.get("target_modules")
    kwargs: dict[str, Any] = {"lora_r": int(recipe.peft.get("r") or 16),
                              "target_modules": list(targets) if isinstance(targets, list)
                              else None}
    try:
        est = memory.estimate(config, plan, **kwargs)
        others = [memory.estimate(config, p, **kwargs) for p in ("cpu", "cuda") if p != plan]
    except ConfigError as e:
        return failure("verification fits", str(e))
    fitting = [o for o in others if o.ram <= limits.ram and o.vram <= limits.vram]
    fix = (f"set verify_device: {fitting[0].plan} in the recipe (estimate: "
           f"{fitting[0].describe()})" if fitting else
           "train on a node with more memory, or set export_gguf: false (PEFT adapter only)")
    try:
        memory.check_fit(est, limits, fix=fix)
    except ConfigError as e:
        return failure("verification fits", str(e))
    return passed("verification fits", f"{est.describe()} — within {limits.source} "
                 f"({memory.gib(limits.ram)} RAM, {memory.gib(limits.vram)} GPU); estimates")


def _gguf_check(path: Path, plan: str, weights_here: bool) -> Check:
    if not weights_here:
        return skipped("base GGUF", f"{path} is checked on the machine that trains")
    if not path.is_file():
        return failure("base GGUF", f"base_gguf {path}: not found — fix base_gguf")
    if plan == "cpu":  # verified against an F32 copy made from it, whatever it holds
        return passed("base GGUF", f"{path} (an F32 copy is verified against)")
    import gguf

    field = gguf.GGUFReader(path).fields.get("general.file_type")
    ftype = int(field.contents()) if field is not None else None
    if ftype not in UNQUANTIZED_FTYPES:
        return failure("base GGUF", f"base_gguf {path}: file type {ftype} is quantized — "
                     "the cuda plan verifies on the GGUF as it is and needs F16, BF16 or F32; "
                     "convert the base with --outtype f16 or set verify_device: cpu")
    return passed("base GGUF", f"{path} ({UNQUANTIZED_FTYPES[ftype]})")


def require(checks: list[Check]) -> None:
    """Raise PreflightFailed with every failed check's reason."""
    failed = [c for c in checks if c.failed]
    if failed:
        raise PreflightFailed("preflight failed before any weight loaded: " +
                              " | ".join(f"{c.name}: {c.detail}" for c in failed), failed)
