"""Cost of the adapter hand-off on SmolLM2-135M: dequantize the served GGUF (cold, then cached),
export a random-B r=8 PEFT LoRA on all seven projections to GGUF (llama.cpp's
convert_lora_to_gguf.py, a subprocess: its torch import is most of the time), verify it
against HF+PEFT on the F32 base (must match) and on the Q4_1 base (reported, not required).

    python bench/gguf_export.py [--cache-dir DIR] [--threads 1] [--max-tokens 16]

Without --cache-dir the dequantization is cold (fresh temporary cache). Ratios against the cold
dequantization in the same run: the cached load (what every later run pays) and the export.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, report

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(ROOT))

from tasks.engine.llama_cpp import default_model_path  # noqa: E402
from tasks.shared.errors import AdapterVerificationError  # noqa: E402
from tasks.training.base_model import f32_gguf, hf_from_gguf  # noqa: E402
from tasks.training.convert import export_lora  # noqa: E402
from tasks.training.verify import AdapterFiles, verify_adapter  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three colors."]


def build_adapter(hf_dir: Path, out: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, local_files_only=True)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(out)


def verify(base: Path, adapter: Path, hf: Path, peft: Path, args: argparse.Namespace) -> dict:
    t = time.monotonic()
    try:
        r = verify_adapter(AdapterFiles(base, adapter, hf, peft), PROMPTS,
                           max_tokens=args.max_tokens, n_threads=args.threads)
        error = None
    except AdapterVerificationError as e:
        r, error = e.report, str(e).split(" — ")[0]
    return {"seconds": round(time.monotonic() - t, 2), "matches_peft": r.get("matches_peft"),
            "differs_from_base": r.get("differs_from_base"),
            "prompts_matching": sum(a == p for a, p in zip(r.get("adapter_token_ids", []),
                                                           r.get("peft_token_ids", []),
                                                           strict=False)),
            "first_logit_max_abs_diff": r.get("first_logit_max_abs_diff"), "error": error}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-gguf-") as tmp_name:
        tmp = Path(tmp_name)
        cache = args.cache_dir or tmp / "cache"
        gguf = default_model_path()
        t = time.monotonic()
        hf = hf_from_gguf(gguf, cache)
        dequant = time.monotonic() - t
        t = time.monotonic()
        hf_from_gguf(gguf, cache)
        cached = time.monotonic() - t
        t = time.monotonic()
        f32 = f32_gguf(gguf, cache)
        f32_s = time.monotonic() - t
        build_adapter(hf, tmp / "peft")
        t = time.monotonic()
        exported = export_lora(tmp / "peft", hf, tmp / "adapter.gguf")
        export_s = time.monotonic() - t
        report({
            "bench": "gguf_export",
            "dequantize_s": round(dequant, 2), "dequantize_cached_s": round(cached, 4),
            # the baseline in the same run: the cold dequantization every run would pay uncached
            "cached_over_cold": round(cached / dequant, 4),
            "export_over_cold_dequantize": round(export_s / dequant, 4),
            "f32_gguf_s": round(f32_s, 2), "export_s": round(export_s, 3),
            "adapter_bytes": exported["bytes"], "threads": args.threads,
            "prompts": len(PROMPTS), "max_tokens": args.max_tokens,
            "verify_f32": verify(f32, tmp / "adapter.gguf", hf, tmp / "peft", args),
            "verify_q4_1": verify(gguf, tmp / "adapter.gguf", hf, tmp / "peft", args),
        })


if __name__ == "__main__":
    main()
