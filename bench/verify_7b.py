"""Adapter verification at OLMo 3 7B's shape on one CUDA GPU (the cuda plan): measured peak RAM
and GPU memory against tasks.training.memory's estimates, and the engines' logit differences
against the cuda plan's tolerances (tasks.training.verify.TOLERANCES["cuda"]).

With `--hf DIR --gguf FILE` (the node: the HF cache's Olmo-3-7B-Think and the served F16 GGUF)
it verifies a random LoRA on the real model. Without them it builds a randomly initialised
model with the 7B's shape (recipes/models/olmo-3-7b-think.config.json; `--layers N` for a
shorter one) in bfloat16, converts it to an F16 GGUF with llama.cpp's own converter — ~30 GB of
disk under --work — and verifies on that: the memory figures are the 7B's, the logit figures
of random weights are not a model's (near-ties everywhere).

    python bench/verify_7b.py [--layers 32] [--work DIR] [--hf DIR --gguf FILE] [--prompts 3]

Needs a CUDA GPU, torch with CUDA and llama-cpp-python built with CUDA; without a GPU it
prints {"bench": "verify_7b", "skipped": …} and exits SKIP (77).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, skip

BENCH = "verify_7b"
CONFIG = ROOT / "recipes" / "models" / "olmo-3-7b-think.config.json"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = ["What did the team decide about the schedule?",
           "Summarise the main risk in one sentence.",
           "Who should follow up with the customer?"]


def random_model(work: Path, layers: int) -> tuple[Path, Path]:
    """An HF folder (bf16, random) with the 7B's shape and a tokenizer, and its F16 GGUF."""
    import torch
    from transformers import AutoTokenizer, Olmo3Config, Olmo3ForCausalLM

    from tasks.engine.llama_cpp import default_model_path
    from tasks.training.convert import export_base

    hf = work / "hf"
    if not (hf / "config.json").is_file():
        shape = json.loads(CONFIG.read_text())
        shape["num_hidden_layers"] = layers
        shape["layer_types"] = shape["layer_types"][:layers]
        # SmolLM2's tokenizer (offline, with a chat template); the vocab stays the 7B's.
        gguf = default_model_path()
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = Olmo3Config(**{k: v for k, v in shape.items() if k not in ("architectures",
                                                                            "model_type",
                                                                            "dtype")},
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.set_default_dtype(torch.bfloat16)
        model = Olmo3ForCausalLM(config)
        torch.set_default_dtype(torch.float32)
        model.save_pretrained(hf)
        tok.save_pretrained(hf)
        model.generation_config.save_pretrained(hf)
        del model
    gguf_out = work / "base.F16.gguf"
    if not gguf_out.is_file():
        export_base(hf, gguf_out, "f16")
    return hf, gguf_out


def random_adapter(hf: Path, work: Path) -> tuple[Path, Path]:
    """The production recipe's LoRA (r=16, every projection) with random lora_B, and its GGUF."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tasks.training.convert import export_lora

    peft_dir, gguf = work / "peft", work / "adapter.gguf"
    if not (peft_dir / "adapter_config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.bfloat16, device_map="meta")
        peft = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS,
                                                task_type="CAUSAL_LM"))
        g = torch.Generator().manual_seed(0)
        state = {}
        for name, p in peft.named_parameters():
            if "lora_" in name:
                std = 0.01 if "lora_B" in name else 1 / p.shape[1] ** 0.5
                state[name] = torch.randn(p.shape, generator=g) * std
        peft.load_state_dict(state, strict=False, assign=True)
        peft.save_pretrained(peft_dir)
    if not gguf.is_file():
        export_lora(peft_dir, hf, gguf, "f32")
    return peft_dir, gguf


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--work", type=Path, help="where the random model goes (default: a temp dir)")
    ap.add_argument("--hf", type=Path, help="a real HF folder (with --gguf)")
    ap.add_argument("--gguf", type=Path, help="its F16/BF16 GGUF")
    ap.add_argument("--prompts", type=int, default=3)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        skip(BENCH, "no CUDA GPU on this machine")
    from tasks.training import memory
    from tasks.training.verify import TOLERANCES, AdapterFiles, verify_adapter

    work = args.work or Path(tempfile.mkdtemp(prefix="verify-7b-"))
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    hf, gguf = (args.hf, args.gguf) if args.hf and args.gguf else random_model(work, args.layers)
    peft_dir, adapter = random_adapter(hf, work)
    prepared = round(time.perf_counter() - t, 1)
    config = memory.load_config(hf)
    est = memory.estimate(config, "cuda", lora_r=16, target_modules=TARGETS)
    error = None
    try:
        report = verify_adapter(AdapterFiles(gguf, adapter, hf, peft_dir),
                                PROMPTS[:args.prompts], n_threads=4, device="cuda",
                                timeout_s=1800)
    except Exception as e:  # the figures are the point: a mismatch is reported, not fatal
        report = getattr(e, "report", {}) or {}
        error = f"{type(e).__name__}: {e}"[:500]
    stages = report.get("memory_mib", {})
    gpu_peak = max([s.get("gpu_used_mib", 0) for s in stages.values()] or [0])
    tol = TOLERANCES["cuda"]
    print(json.dumps({
        "bench": BENCH, "gpu": torch.cuda.get_device_name(), "model": str(hf),
        "parameters": memory.param_count(config).total, "prepare_s": prepared,
        "measured": {"peak_rss_mib": report.get("peak_rss_mib"), "gpu_used_peak_mib": gpu_peak,
                     "per_stage": stages,
                     "first_logit_max_abs_diff": report.get("first_logit_max_abs_diff"),
                     "exact_matches": report.get("exact_matches"),
                     "near_tie_divergences": report.get("near_tie_divergences")},
        "estimate": {"peak_rss_mib": est.peak_rss // memory.MIB,
                     "ram_with_node_reserve_mib": est.ram // memory.MIB,
                     "vram_mib": est.vram // memory.MIB,
                     "parts_mib": {k: v // memory.MIB for k, v in est.parts.items()}},
        "tolerance": {"tie_gap": tol.tie_gap, "max_logit_diff": tol.max_logit_diff,
                      "source": tol.source},
        "fits_g2_standard_4": {"ram": est.ram <= memory.G2_STANDARD_4.ram,
                               "vram_measured": gpu_peak * memory.MIB <= memory.G2_STANDARD_4.vram},
        "verification_error": error}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
