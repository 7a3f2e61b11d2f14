"""QLoRA / LoRA training with TRL: SFT on engineering tuples, DPO on apprenticeship pairs.

Plain functions (no Prefect): the training job (tasks/training/job.py) wraps them with the
`gpu` slot, reporting and the registry. The job loads the dataset and checks the device once,
before it takes the slot, and hands both to `train`, which returns a `TrainRun`. Heavy imports
(torch, transformers, trl) happen inside the functions so that importing this module, and a
bad parameter, cost nothing.
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl
from prefect.exceptions import TerminationSignal

from tasks.engine.llama_cpp import default_model_path
from tasks.shared.errors import ConfigError, SlmNightlyError
from tasks.training.base_model import hf_from_gguf
from tasks.training.offline import import_bitsandbytes_offline
from tasks.training.params import Recipe
from tasks.training.quiet import quiet_libraries


class TrainingError(SlmNightlyError):
    """Training could not start or did not finish."""


# --- what runs where ---------------------------------------------------------------------------

def device_report(required_free_mib: int) -> dict[str, Any]:
    """The accelerator, and the check that it has room before any weight is loaded."""
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu", "note": "no CUDA device: training on the CPU (slow, LoRA in "
                "float32; 4-bit only when load_in_4bit is set)"}
    free, total = torch.cuda.mem_get_info()
    name = torch.cuda.get_device_name()
    check_free_memory(name, free // 2**20, total // 2**20, required_free_mib)
    return {"device": "cuda", "name": name, "free_mib": free // 2**20,
            "total_mib": total // 2**20}


def check_free_memory(name: str, free_mib: int, total_mib: int, required_mib: int) -> None:
    """Refuse a card that something else still holds, naming both numbers."""
    if free_mib < required_mib:
        raise TrainingError(f"GPU {name}: {free_mib} MiB free of {total_mib} MiB, the run needs "
                            f"{required_mib} MiB (required_free_gpu_mib) — stop what holds "
                            "the card (is the inference server still up?) or lower the setting")


def resolve_base_model(spec: str, cache_dir: Path) -> tuple[Path, Path | None]:
    """(HF folder to train on, GGUF the server serves or None) from a base-model spec."""
    if not spec:
        spec = str(default_model_path())
    path = Path(spec)
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ConfigError(f"base model {spec}: GGUF file not found — fix base_model")
        return hf_from_gguf(path, cache_dir), path
    if path.exists() or spec.startswith((".", "/")):
        if not (path / "config.json").is_file():
            raise ConfigError(f"base model {spec}: no config.json in that folder — base_model "
                              "must be a Hugging Face model folder, a .gguf file or "
                              "'org/name@revision'")
        return path, None
    repo, _, revision = spec.partition("@")
    if repo.count("/") != 1:
        raise ConfigError(f"base model {spec!r}: not a folder, a .gguf file or 'org/name@revision'")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:  # never from the hub at run time: the node image carries the weights
        return Path(snapshot_download(repo, revision=revision or None, local_files_only=True)), None
    except LocalEntryNotFoundError as e:
        raise ConfigError(f"base model {spec}: not in the local Hugging Face cache — bake it "
                          f"into the node image (`hf download {repo} --revision "
                          f"{revision or 'main'}`) or pass a local folder") from e


# --- data ---------------------------------------------------------------------------------------

def load_splits(dataset: Path, method: str, max_eval_rows: int
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and eval rows in TRL's conversational form (prompt-completion for SFT, so the
    loss covers the assistant's answer only; prompt/chosen/rejected for DPO)."""
    if not dataset.is_file():
        raise ConfigError(f"dataset {dataset}: not found — run the scorecard first (it writes "
                          "<state_dir>/datasets/<bucket>/<digest>.parquet for a passing bucket)")
    df = pl.read_parquet(dataset)
    need = {"sft": {"messages"}, "dpo": {"prompt", "chosen", "rejected"}}[method] | {"split"}
    missing = need - set(df.columns)
    if missing:
        raise ConfigError(f"dataset {dataset}: columns {sorted(missing)} missing for method "
                          f"{method} — is this the {'SFT' if method == 'dpo' else 'DPO'} "
                          "bucket's dataset?")
    rows: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    for r in df.iter_rows(named=True):
        if method == "sft":
            msgs = [{"role": m["role"], "content": m["content"]} for m in r["messages"]]
            if len(msgs) < 2 or msgs[-1]["role"] != "assistant":
                continue
            row = {"prompt": msgs[:-1], "completion": msgs[-1:]}
        else:
            row = {k: [{"role": m["role"], "content": m["content"]} for m in r[k]]
                   for k in ("prompt", "chosen", "rejected")}
        rows["eval" if r["split"] == "eval" else "train"].append(row)
    if not rows["train"]:
        raise ConfigError(f"dataset {dataset}: no training rows ({df.height} rows in the file) "
                          "— nothing to train on; check the scorecard for this bucket")
    if not rows["eval"]:  # a tiny corpus: hold out the tail rather than evaluate on train
        cut = max(1, len(rows["train"]) // 20)
        rows["eval"], rows["train"] = rows["train"][-cut:], rows["train"][:-cut] or rows["train"]
    return rows["train"], rows["eval"][:max_eval_rows]


# --- model --------------------------------------------------------------------------------------

class Loaded(NamedTuple):
    """A model and its tokenizer (load_model's: the base with the recipe's LoRA attached)."""

    model: Any
    tok: Any


def load_model(recipe: Recipe, hf_dir: Path, cuda: bool) -> Loaded:
    """The base model (NF4 when `load_in_4bit`) with the recipe's LoRA attached, and its
    tokenizer."""
    import torch

    import_bitsandbytes_offline()
    from peft import get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    load_in_4bit = recipe.project.load_in_4bit
    four_bit = cuda if load_in_4bit is None else load_in_4bit
    dtype = (torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else
             torch.float16 if cuda else torch.float32)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if four_bit:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(hf_dir, **kwargs)
    if four_bit:
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=bool(recipe.trl["activation_checkpointing"]))
    lora = recipe.lora_config()
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    targets = lora.target_modules
    unknown = sorted(set([targets] if isinstance(targets, str) else targets or []) - names)
    if unknown and not isinstance(targets, str):  # a string is a regex: PEFT checks it
        raise ConfigError(f"peft: target_modules {unknown} not found in {hf_dir.name} — its "
                          f"linear layers include {sorted(n for n in names if n.endswith('_proj'))}")
    return Loaded(get_peft_model(model, lora), tok)


# --- evaluation (the promotion gate compares like with like) -------------------------------------

def _completion_logps(model: Any, tok: Any, prompt: list[dict[str, str]],
                      completion: list[dict[str, str]], max_length: int) -> tuple[float, int]:
    """Sum of log-probabilities of the completion's tokens given the prompt, and their count."""
    import torch

    p_ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                    return_dict=False)
    full = tok.apply_chat_template(prompt + completion, tokenize=True, return_dict=False)
    if hasattr(p_ids, "input_ids"):
        p_ids, full = p_ids["input_ids"], full["input_ids"]
    comp = list(full[len(p_ids):])
    if len(p_ids) + len(comp) > max_length:  # keep the answer's start and the prompt's end
        comp = comp[:max(1, max_length // 2)]
        p_ids = p_ids[-(max_length - len(comp)):]
    ids, n_prompt = list(p_ids) + comp, len(p_ids)
    x = torch.tensor([ids], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=x).logits[0, :-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    target = x[0, 1:]
    tok_lp = logp.gather(1, target[:, None])[:, 0][n_prompt - 1:]
    return float(tok_lp.sum()), int(tok_lp.numel())


def eval_loss(loaded: Loaded, rows: list[dict[str, Any]], recipe: Recipe, adapter: str | None,
              ref_cache: dict[int, tuple[float, float]] | None = None) -> float:
    """Held-out loss with `adapter` active (None: the base model, adapter off), by the recipe's
    method, max_length and beta.
    SFT: mean NLL per completion token. DPO: mean DPO loss with the base as reference."""
    model, tok = loaded
    method, max_length, beta = recipe.method, recipe.max_length, recipe.beta
    was_training = model.training
    model.eval()
    try:
        if method == "sft":
            total, count = 0.0, 0
            for r in rows:
                with model.disable_adapter() if adapter is None else nullcontext():
                    if adapter is not None:
                        model.set_adapter(adapter)
                    lp, n = _completion_logps(model, tok, r["prompt"], r["completion"], max_length)
                total, count = total - lp, count + n
            return total / max(count, 1)
        losses = []
        for i, r in enumerate(rows):
            cache = {} if ref_cache is None else ref_cache  # the reference: adapter off
            if i not in cache:
                with model.disable_adapter():
                    cache[i] = (
                        _completion_logps(model, tok, r["prompt"], r["chosen"], max_length)[0],
                        _completion_logps(model, tok, r["prompt"], r["rejected"], max_length)[0])
            ref_c, ref_r = cache[i]
            if adapter is None:
                pol_c, pol_r = ref_c, ref_r
            else:
                model.set_adapter(adapter)
                pol_c, _ = _completion_logps(model, tok, r["prompt"], r["chosen"], max_length)
                pol_r, _ = _completion_logps(model, tok, r["prompt"], r["rejected"], max_length)
            z = beta * ((pol_c - ref_c) - (pol_r - ref_r))
            losses.append(math.log1p(math.exp(-z)) if z > -30 else -z)
        return sum(losses) / len(losses)
    finally:
        model.set_adapter("default")
        model.train(was_training)


# --- the run ------------------------------------------------------------------------------------

@dataclass
class Hooks:
    """What the flow wants to hear while training runs (all optional)."""

    on_start: Callable[[int], None] | None = None                  # total steps
    on_log: Callable[[int, int, dict[str, float]], None] | None = None  # step, total, logs
    on_save: Callable[[int, str], None] | None = None               # step, checkpoint dir


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest complete checkpoint (trainer_state.json is written last)."""
    done = [p for p in ckpt_dir.glob("checkpoint-*") if (p / "trainer_state.json").is_file()]
    return max(done, key=lambda p: checkpoint_step(p.name), default=None)


def checkpoint_step(name: str) -> int:
    """The step of a Trainer checkpoint folder's name (checkpoint-N)."""
    return int(name.rsplit("-", 1)[-1])


def peak_memory_mib(cuda: bool) -> float:
    if cuda:
        import torch

        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


def _trainer(recipe: Recipe, loaded: Loaded,
             splits: tuple[list[dict[str, Any]], list[dict[str, Any]]], ckpt_dir: Path,
             cuda: bool, callbacks: list[Any]) -> Any:
    from datasets import Dataset

    model, tok = loaded
    train_rows, eval_rows = splits
    args = recipe.trl_config(ckpt_dir, cuda, bf16=_bf16())
    train_ds, eval_ds = Dataset.from_list(train_rows), Dataset.from_list(eval_rows)
    if recipe.method == "sft":
        from trl import SFTTrainer

        return SFTTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                          processing_class=tok, callbacks=callbacks)
    from trl import DPOTrainer

    return DPOTrainer(model=model, ref_model=None, args=args, train_dataset=train_ds,
                      eval_dataset=eval_ds, processing_class=tok, callbacks=callbacks)


def _finished(checkpoint: Path) -> bool:
    """Whether the checkpoint is the run's last step (its trainer_state.json says so)."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return bool(state.get("max_steps")) and state["global_step"] >= state["max_steps"]


def _load_finished(trainer: Any, model: Any, checkpoint: Path) -> float:
    """Put a finished run's adapter weights and state back; return its last training loss."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import TrainerState

    set_peft_model_state_dict(model, load_file(str(checkpoint / "adapter_model.safetensors")))
    trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return float(losses[-1]) if losses else float("nan")


def _is_termination(e: BaseException) -> bool:
    return isinstance(e, KeyboardInterrupt | TerminationSignal)


def _bf16() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


@dataclass
class TrainRun:
    """What one call of `train` did: the trainer's report (kept in the adapter's manifest as
    `training`, without the history) and the loss history (losses.json, loss.png)."""

    device: dict[str, Any]
    steps: int
    max_steps: int
    resumed_from: str | None  # the checkpoint's folder name, None: from step 0
    resumed_step: int
    train_rows: int
    eval_rows: int
    train_loss: float
    seconds: float
    steps_per_second: float | None
    tokens_per_second: float | None
    peak_mib: float
    peak_kind: str  # "gpu" (CUDA's peak allocation) or "rss" (the process's peak)
    eval_loss: dict[str, float]  # held-out loss of "base", "new" and (if any) "promoted"
    history: list[dict[str, Any]]  # the Trainer's log rows with a loss or an eval loss
    peft_dir: str
    pid: int

    def report(self) -> dict[str, Any]:
        """The manifest's `training`: every field but the history, in this order."""
        return {k: v for k, v in asdict(self).items() if k != "history"}


@dataclass(frozen=True)
class TrainPaths:
    """Where one training run reads and writes: the HF base folder it trains on, the folder of
    its checkpoints (it resumes from the newest), the folder the adapter is saved under
    (out_dir/peft), and the promoted adapter's PEFT folder (None: nothing promoted), whose
    held-out loss it measures too."""

    hf_dir: Path
    ckpt_dir: Path
    out_dir: Path
    promoted_adapter: Path | None = None


def train(recipe: Recipe, splits: tuple[list[dict[str, Any]], list[dict[str, Any]]],
          dev: dict[str, Any], paths: TrainPaths, hooks: Hooks) -> TrainRun:
    """Train on `splits` (from `load_splits`) on the device `dev` (from `device_report`),
    resuming from the newest checkpoint in `paths.ckpt_dir`; save the adapter to
    `paths.out_dir/peft`, and measure held-out loss for the base, the promoted adapter and the
    new one.
    A termination (SIGTERM via Prefect, Ctrl-C) checkpoints the steps done, then propagates."""
    with quiet_libraries():
        return _train(recipe, splits, dev, paths, hooks)


def _train(recipe: Recipe, splits: tuple[list[dict[str, Any]], list[dict[str, Any]]],
           dev: dict[str, Any], paths: TrainPaths, hooks: Hooks) -> TrainRun:
    import torch
    from transformers import TrainerCallback

    ckpt_dir, out_dir = paths.ckpt_dir, paths.out_dir
    cuda = dev["device"] == "cuda"
    train_rows, eval_rows = splits
    torch.manual_seed(int(recipe.trl.get("seed", 42)))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    loaded = load_model(recipe, paths.hf_dir, cuda)
    model = loaded.model
    run: dict[str, Any] = {"t0": None, "step0": 0}

    class Reporter(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            st = state
            run["t0"], run["step0"] = time.monotonic(), st.global_step
            if hooks.on_start:
                hooks.on_start(st.max_steps)

        def on_log(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            st, logs = state, kw.get("logs")
            if hooks.on_log and logs:
                elapsed = time.monotonic() - (run["t0"] or time.monotonic())
                vals = {k: float(v) for k, v in logs.items() if isinstance(v, int | float)}
                if "num_tokens" in vals and elapsed > 0:
                    vals["tokens_per_second"] = round(vals["num_tokens"] / elapsed, 1)
                vals["peak_mib"] = peak_memory_mib(cuda)
                hooks.on_log(st.global_step, st.max_steps, vals)

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if hooks.on_save:
                hooks.on_save(state.global_step, str(ckpt_dir / f"checkpoint-{state.global_step}"))

    trainer = _trainer(recipe, loaded, splits, ckpt_dir, cuda, [Reporter()])
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):  # the Reporter logs through Prefect instead
        trainer.remove_callback(cb)
    resume = latest_checkpoint(ckpt_dir)
    started = time.monotonic()
    try:
        if resume is not None and _finished(resume):
            # Training ended there (a later step failed: export, verification, a lost node).
            # The Trainer would run one more step past max_steps when resumed from its final
            # checkpoint (transformers 5.24): load the adapter instead, train nothing.
            train_loss = _load_finished(trainer, model, resume)
            run["t0"], run["step0"] = time.monotonic(), trainer.state.global_step
            if hooks.on_start:
                hooks.on_start(trainer.state.max_steps)
        else:
            train_loss = trainer.train(
                resume_from_checkpoint=str(resume) if resume else None).training_loss
    except BaseException as e:
        # SIGTERM (Prefect's cancellation, a preempted node) arrives as an exception raised
        # wherever the loop was: save what the steps so far learned, inside the 30 s grace.
        if _is_termination(e) and trainer.state.global_step > run["step0"]:
            try:
                trainer._save_checkpoint(trainer.model, trial=None)
                if hooks.on_save:
                    hooks.on_save(trainer.state.global_step, str(
                        ckpt_dir / f"checkpoint-{trainer.state.global_step}"))
            except Exception:  # noqa: BLE001 - the termination is what must propagate
                pass
        raise
    seconds = time.monotonic() - started
    step = trainer.state.global_step
    peft_dir = out_dir / "peft"
    model.save_pretrained(peft_dir)
    ref: dict[int, tuple[float, float]] = {}  # DPO reference log-probs, shared by the three
    losses = {"base": eval_loss(loaded, eval_rows, recipe, None, ref),
              "new": eval_loss(loaded, eval_rows, recipe, "default", ref)}
    if paths.promoted_adapter is not None:
        model.load_adapter(str(paths.promoted_adapter), adapter_name="promoted")
        losses["promoted"] = eval_loss(loaded, eval_rows, recipe, "promoted", ref)
        model.delete_adapter("promoted")
    history = [h for h in trainer.state.log_history if "loss" in h or "eval_loss" in h]
    return TrainRun(
        device=dev, steps=step, max_steps=trainer.state.max_steps,
        resumed_from=resume.name if resume else None, resumed_step=run["step0"],
        train_rows=len(train_rows), eval_rows=len(eval_rows),
        train_loss=round(float(train_loss), 4), seconds=round(seconds, 2),
        steps_per_second=round((step - run["step0"]) / seconds, 3) if seconds else None,
        tokens_per_second=next((round(h["num_tokens"] / seconds, 1) for h in reversed(history)
                                if "num_tokens" in h and seconds), None),
        peak_mib=peak_memory_mib(cuda), peak_kind="gpu" if cuda else "rss",
        eval_loss={k: round(v, 5) for k, v in losses.items()},
        history=history, peft_dir=str(peft_dir), pid=os.getpid(),
    )
