"""Export a PEFT LoRA adapter as a GGUF LoRA that llama.cpp loads next to the served base model.

The nightly trains on the dequantized base (HF layout) and serves with llama.cpp (GGUF layout),
so the adapter has to cross that boundary without changing what it computes:

- names: PEFT's module paths become GGUF tensor names through gguf-py's own name map, so the
  adapter names exactly the tensors llama.cpp looks up (`blk.N.attn_q.weight.lora_a`, ...);
- layout: llama-family GGUFs store q/k rows rope-permuted (transformers un-permutes them when it
  dequantizes), so lora_B of q/k gets the same permutation here — without it llama.cpp loads
  the adapter happily and computes something else;
- scale: llama.cpp multiplies B·A·x by `alpha / rank` (rank read from each tensor). PEFT's scale
  is `alpha / r`, or `alpha / sqrt(r)` with rsLoRA, possibly per module (rank/alpha patterns),
  so the alpha written is PEFT's scale × rank, and any module whose scale differs from the rest
  has the ratio folded into its lora_B.

Only what llama.cpp can apply is accepted: LoRA on linear layers inside the transformer blocks.
Anything else (embeddings, lm_head, DoRA, trained biases, modules_to_save) is refused with the
module's name, rather than exported into an adapter that silently drops part of the training.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tasks.errors import ConfigError

PEFT_PREFIX = "base_model.model."
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
REFUSED_LEAVES = ("embed_tokens", "lm_head", "wte", "wpe", "embed_in", "embed_out")
FIX_TARGETS = ("retrain with target_modules limited to the transformer blocks' linear layers "
               "(q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)")


@dataclass(frozen=True)
class ArchSpec:
    """How one HF `model_type` maps onto llama.cpp."""

    gguf_arch: str  # gguf MODEL_ARCH name, also general.architecture
    permute_qk: bool  # GGUF stores q/k rows rope-permuted relative to HF


# Only architectures whose export has been checked token-for-token against HF+PEFT
# (tasks.training.verify): llama (SmolLM2, here) and Gemma 3 (FIELD-NOTES). Add others only after
# verifying them the same way — a wrong layout loads without any error.
ARCHS: dict[str, ArchSpec] = {
    "llama": ArchSpec("llama", permute_qk=True),
    "gemma3": ArchSpec("gemma3", permute_qk=False),
    "gemma3_text": ArchSpec("gemma3", permute_qk=False),
}


@dataclass
class _Pair:
    module: str  # HF module path, e.g. model.layers.0.self_attn.q_proj
    gguf_name: str  # e.g. blk.0.attn_q.weight
    a: np.ndarray  # [r, in]
    b: np.ndarray  # [out, r]


def export_gguf_lora(adapter_dir: Path, base_hf_dir: Path, out_path: Path,
                     dtype: Literal["f32", "f16"] = "f32") -> dict[str, Any]:
    """Write `out_path` (a GGUF LoRA adapter) from a PEFT adapter folder and the base model's
    config.json; return a small report (arch, tensors, rank, alpha, bytes, ...).

    The file appears atomically: a reader (the inference server) sees the old file or the
    complete new one, never a torn write that would segfault llama.cpp on first use.
    """
    return _export(Path(adapter_dir), Path(base_hf_dir), Path(out_path), dtype, permute_qk=True)


def _export(adapter_dir: Path, base_hf_dir: Path, out_path: Path, dtype: str,
            *, permute_qk: bool) -> dict[str, Any]:
    """`export_gguf_lora`, with the q/k permutation switchable so tests can produce the classic
    wrong adapter (loads fine, computes the wrong thing) and prove verification catches it."""
    import gguf

    if dtype not in ("f32", "f16"):
        raise ConfigError(f"adapter dtype {dtype!r} is not supported — use 'f32' or 'f16'")
    config = _read_json(adapter_dir / ADAPTER_CONFIG, "PEFT adapter config",
                        "save the adapter with model.save_pretrained(adapter_dir)")
    base = _read_json(base_hf_dir / "config.json", "base model config",
                      "pass the folder made by tasks.training.base_model.hf_from_gguf")
    _check_peft_config(config, adapter_dir)
    spec = _arch(base, base_hf_dir)
    missing = [k for k in ("num_hidden_layers", "num_attention_heads") if k not in base]
    if missing:
        raise ConfigError(f"{base_hf_dir / 'config.json'} lacks {', '.join(missing)} — pass the "
                          "folder made by tasks.training.base_model.hf_from_gguf")
    n_layers = int(base["num_hidden_layers"])
    name_map = gguf.get_tensor_name_map(_model_arch(spec.gguf_arch), n_layers)

    pairs = _pairs(adapter_dir, name_map)
    if not pairs:
        raise ConfigError(f"no LoRA tensors in {adapter_dir / ADAPTER_WEIGHTS} — the adapter is "
                          "empty; check target_modules matched the model's layers")
    alpha, baked = _fold_scales(pairs, config)
    permuted = 0
    if spec.permute_qk and permute_qk:
        permuted = _permute_qk(pairs, base)

    np_dtype = np.float32 if dtype == "f32" else np.float16
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(tmp, spec.gguf_arch)
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        for p in pairs:  # a before b: gguf-py's size accounting expects the pair in that order
            writer.add_tensor(f"{p.gguf_name}.lora_a", np.ascontiguousarray(p.a, dtype=np_dtype))
            writer.add_tensor(f"{p.gguf_name}.lora_b", np.ascontiguousarray(p.b, dtype=np_dtype))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)

    ranks = sorted({p.a.shape[0] for p in pairs})
    return {
        "path": str(out_path),
        "arch": spec.gguf_arch,
        "tensors": 2 * len(pairs),
        "modules": len(pairs),
        "rank": ranks[0] if len(ranks) == 1 else ranks,
        "alpha": alpha,
        "dtype": dtype,
        "bytes": out_path.stat().st_size,
        "qk_permuted": permuted,
        "scale_folded_modules": baked,
    }


def _read_json(path: Path, what: str, fix: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path} — {fix}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} {path} is not valid JSON ({e}) — {fix}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} is not a JSON object — {fix}")
    return data


def _check_peft_config(config: dict[str, Any], adapter_dir: Path) -> None:
    """Refuse the PEFT features a llama.cpp LoRA cannot express."""
    where = adapter_dir / ADAPTER_CONFIG
    if config.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"{where}: peft_type {config.get('peft_type')!r} is not LoRA — only "
                          "LoRA adapters can be exported to GGUF")
    if config.get("use_dora"):
        raise ConfigError(f"{where}: DoRA (use_dora=true) has a magnitude vector llama.cpp "
                          "cannot apply — retrain with use_dora=False")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        raise ConfigError(f"{where}: trained biases (bias={config.get('bias')!r}, lora_bias="
                          f"{config.get('lora_bias')!r}) are not part of a GGUF LoRA — retrain "
                          "with bias='none', lora_bias=False")
    if config.get("modules_to_save"):
        raise ConfigError(f"{where}: modules_to_save={config['modules_to_save']} stores full "
                          "weights llama.cpp adapters cannot carry — retrain without "
                          "modules_to_save")
    if config.get("trainable_token_indices"):
        raise ConfigError(f"{where}: trainable_token_indices changes the embeddings, which a "
                          "GGUF LoRA cannot carry — retrain without it")
    if not config.get("lora_alpha"):
        raise ConfigError(f"{where}: lora_alpha is {config.get('lora_alpha')!r}; a zero scale "
                          "would make the adapter a no-op — check the training config")


def _arch(base: dict[str, Any], base_hf_dir: Path) -> ArchSpec:
    model_type = str(base.get("model_type", ""))
    spec = ARCHS.get(model_type)
    if spec is None:
        raise ConfigError(f"{base_hf_dir / 'config.json'}: model_type {model_type!r} has no "
                          f"verified GGUF LoRA export (supported: {', '.join(sorted(ARCHS))}) — "
                          "add it to tasks.training.gguf_lora.ARCHS after checking its q/k layout with "
                          "tasks.training.verify")
    return spec


def _model_arch(name: str) -> Any:
    import gguf

    for arch, arch_name in gguf.MODEL_ARCH_NAMES.items():
        if arch_name == name:
            return arch
    raise ConfigError(f"gguf {gguf.__name__} does not know architecture {name!r} — upgrade gguf")


def _pairs(adapter_dir: Path, name_map: Any) -> list[_Pair]:
    """LoRA A/B pairs keyed by module, mapped to GGUF names; refuses anything else."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = adapter_dir / ADAPTER_WEIGHTS
    if not path.is_file():
        raise ConfigError(f"adapter weights not found: {path} — save the adapter with "
                          "model.save_pretrained(adapter_dir) (safetensors, the default)")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e} — the file is corrupt or not safetensors; "
                          "re-save the adapter") from e

    halves: dict[str, dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        m = LORA_KEY.match(key)
        module = (m.group("module") if m else key).removeprefix(PEFT_PREFIX)
        if any(part in REFUSED_LEAVES for part in module.split(".")):
            raise ConfigError(f"{path}: LoRA on {module!r} (embeddings / lm_head) cannot be "
                              f"applied by llama.cpp adapters — {FIX_TARGETS}")
        if m is None:
            raise ConfigError(f"{path}: tensor {key!r} is not a LoRA A/B weight (DoRA magnitude, "
                              f"embedding LoRA, bias or saved module) — {FIX_TARGETS}, "
                              "use_dora=False, bias='none'")
        halves.setdefault(module, {})[m.group("ab")] = value

    pairs = []
    for module, ab in sorted(halves.items(), key=lambda kv: _natural_key(kv[0])):
        if set(ab) != {"A", "B"}:
            raise ConfigError(f"{path}: module {module!r} has lora_{'A' if 'A' in ab else 'B'} "
                              "but not its partner — the file is incomplete; re-save the adapter")
        a, b = ab["A"], ab["B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise ConfigError(f"{path}: module {module!r} has lora_A {a.shape} / lora_B "
                              f"{b.shape}, not a linear LoRA pair [r, in] / [out, r] — "
                              f"{FIX_TARGETS}")
        gguf_name = name_map.get_name(f"{module}.weight", try_suffixes=(".weight",))
        if gguf_name is None or not gguf_name.startswith("blk."):
            raise ConfigError(f"{path}: module {module!r} has no llama.cpp tensor to attach a "
                              f"LoRA to — {FIX_TARGETS}")
        pairs.append(_Pair(module, gguf_name, a.astype(np.float32), b.astype(np.float32)))
    return pairs


def _natural_key(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _fold_scales(pairs: list[_Pair], config: dict[str, Any]) -> tuple[float, int]:
    """Choose the GGUF alpha and fold per-module scale differences into lora_B.

    llama.cpp applies `alpha / r_m` with one alpha per file; PEFT applies `s_m` (alpha_m / r_m,
    or alpha_m / sqrt(r_m) with rsLoRA). Writing alpha = s_m · r_m reproduces s_m exactly; when
    modules disagree (rank/alpha patterns), the most common value wins and the others' lora_B
    is multiplied by the ratio. Returns (alpha, modules folded).
    """
    from peft.utils.other import get_pattern_key

    alpha_pattern: dict[str, float] = config.get("alpha_pattern") or {}
    rslora = bool(config.get("use_rslora"))
    wanted: list[float] = []
    for p in pairs:
        r = p.a.shape[0]
        key = get_pattern_key(list(alpha_pattern), p.module)
        alpha_m = float(alpha_pattern.get(key, config["lora_alpha"]))
        scale = alpha_m / math.sqrt(r) if rslora else alpha_m / r
        wanted.append(scale * r)  # the GGUF alpha that gives this module PEFT's scale
    alpha = Counter(wanted).most_common(1)[0][0]
    folded = 0
    for p, w in zip(pairs, wanted, strict=True):
        if w != alpha:
            p.b = p.b * np.float32(w / alpha)
            folded += 1
    return float(alpha), folded


def _permute_qk(pairs: list[_Pair], base: dict[str, Any]) -> int:
    """Rope-permute q/k lora_B rows into GGUF order; returns how many tensors were permuted."""
    n_head = int(base["num_attention_heads"])
    n_kv = int(base.get("num_key_value_heads") or n_head)
    done = 0
    for p in pairs:
        kind = p.gguf_name.split(".")[2]
        if kind in ("attn_q", "attn_k"):
            p.b = rope_permute_rows(p.b, n_head if kind == "attn_q" else n_kv, p.module)
            done += 1
    return done


def rope_permute_rows(w: np.ndarray, n_head: int, what: str = "tensor") -> np.ndarray:
    """HF → GGUF row order for one q or k projection output (rows = heads × head_dim).

    Within each head HF keeps the rotary pairs as two halves [x0..x(d/2-1) | y0..y(d/2-1)];
    llama.cpp expects them interleaved [x0 y0 x1 y1 ...]. Viewing the head's rows as (2, d/2)
    and transposing to (d/2, 2) interleaves them.
    """
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ConfigError(f"{what}: {rows} output rows do not split into {n_head} heads of even "
                          "size — the base config's head counts do not match the adapter")
    half = rows // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
