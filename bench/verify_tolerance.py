"""How far llama.cpp and HF+PEFT part when verification runs in 16-bit (the cuda plan's
engines and dtypes), measured on the CPU: the numbers tasks.training.verify's cuda tolerances
come from.

For SmolLM2-135M (its GGUFs rewritten from the bundled one by llama.cpp, its HF folder
dequantized from it) and a tiny random OLMo 3 (4 layers, sliding + full attention, built
here; its GGUFs by llama.cpp's converter), a random LoRA (r=8, every projection) is verified three
ways with the same child the flow uses: F32 GGUF vs HF float32 (today's cpu plan), F16 GGUF vs
HF bfloat16 and BF16 GGUF vs HF bfloat16 (the cuda plan's pair). Prints, per model and pair,
the first-token logit differences, exact greedy matches and the HF logit gaps where greedy
outputs parted.

    python bench/verify_tolerance.py [--prompts 6] [--tokens 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT

BENCH = "verify_tolerance"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = ["What did the team decide about the schedule?",
           "Summarise the main risk in one sentence.",
           "Who should follow up with the customer?", "What is the capital of France?",
           "Write a haiku about the sea.", "List three uses of a graph database."]


def smollm2(work: Path) -> Path:
    from tasks.engine.llama_cpp import default_model_path
    from tasks.training.base_model import hf_from_gguf

    return hf_from_gguf(default_model_path(), ROOT / ".slm-nightly" / "models")


def olmo3_tiny(work: Path) -> Path:
    """OLMo 3's architecture at toy size (as tests/support/olmo3_tiny.py builds it)."""
    import torch
    from transformers import AutoTokenizer, Olmo3Config, Olmo3ForCausalLM

    from tasks.engine.llama_cpp import default_model_path

    out = work / "olmo3-tiny"
    gguf = default_model_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = Olmo3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         layer_types=["sliding_attention"] * 3 + ["full_attention"],
                         sliding_window=8, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, initializer_range=0.2)
    torch.manual_seed(0)
    Olmo3ForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def requantize(gguf_type: str, out: Path) -> None:
    """The bundled SmolLM2 GGUF rewritten as F32/F16/BF16 by llama.cpp (its HF folder has no
    tokenizer the HF→GGUF converter reads without sentencepiece)."""
    import llama_cpp

    from tasks.engine.llama_cpp import default_model_path

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"f32": llama_cpp.LLAMA_FTYPE_ALL_F32, "f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
                    "bf16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16}[gguf_type]
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(default_model_path()).encode(), str(out).encode(),
                                        params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize to {gguf_type} failed ({rc})")


def adapter(hf: Path, work: Path) -> tuple[Path, Path]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tasks.training.convert import export_lora

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS,
                                            task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    peft.save_pretrained(work / "peft")
    export_lora(work / "peft", hf, work / "adapter.gguf", "f32")
    return work / "peft", work / "adapter.gguf"


def compare(hf: Path, gguf: Path, hf_dtype: str, peft: Path, lora: Path, prompts: list[str],
            tokens: int) -> dict[str, Any]:
    """One verification child (tasks/training/verify.py) with this GGUF and HF dtype."""
    from tasks.training.verify import _run_child

    with tempfile.TemporaryDirectory() as tmp:
        req, res, log = Path(tmp) / "r.json", Path(tmp) / "o.json", Path(tmp) / "l.log"
        req.write_text(json.dumps({
            "base_gguf": str(gguf), "adapter_gguf": str(lora), "hf_base_dir": str(hf),
            "peft_adapter_dir": str(peft), "prompts": prompts, "max_tokens": tokens,
            "n_threads": 1, "device": "cpu", "hf_dtype": hf_dtype, "n_gpu_layers": 0,
            "tie_gap": 0.1}))
        rc, stage = _run_child(req, res, log, 1, 1800)
        out = json.loads(res.read_text()) if res.is_file() else {}
    diffs = out.get("first_logit_max_abs_diff") or [float("nan")]
    return {"rc": rc, "stage": stage, "first_logit_max_abs_diff": diffs,
            "max": max(diffs), "exact_matches": out.get("exact_matches"),
            "parted_at_hf_gaps": [d["hf_logit_gap"] for d in out.get("near_tie_divergences", [])],
            "peak_rss_mib": out.get("peak_rss_mib")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    from tasks.training.convert import export_base
    from tasks.training.verify import CUDA_MAX_LOGIT_DIFF, CUDA_TIE_GAP

    t = time.perf_counter()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="verify-tolerance-") as tmp:
        for name, build in (("smollm2-135m", smollm2), ("olmo3-tiny", olmo3_tiny)):
            work = Path(tmp) / name
            work.mkdir()
            hf = build(work)
            peft, lora = adapter(hf, work)
            results[name] = {}
            for gguf_type, hf_dtype in (("f32", "float32"), ("f16", "bfloat16"),
                                        ("bf16", "bfloat16")):
                gguf = work / f"base.{gguf_type}.gguf"
                if name == "smollm2-135m":  # from the served GGUF, as f32_gguf does
                    requantize(gguf_type, gguf)
                else:  # llama.cpp's own converter, as the node's base GGUF is made
                    export_base(hf, gguf, gguf_type)
                results[name][f"{gguf_type}-gguf-vs-hf-{hf_dtype}"] = compare(
                    hf, gguf, hf_dtype, peft, lora, PROMPTS[:args.prompts], args.tokens)
    worst16 = max(r["max"] for m in results.values() for k, r in m.items() if "bfloat16" in k)
    print(json.dumps({"bench": BENCH, "seconds": round(time.perf_counter() - t, 1),
                      "results": results, "worst_16bit_first_logit_diff": worst16,
                      "cuda_plan_bounds": {"max_logit_diff": CUDA_MAX_LOGIT_DIFF,
                                           "tie_gap": CUDA_TIE_GAP},
                      "bounds_hold": worst16 <= CUDA_MAX_LOGIT_DIFF}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
