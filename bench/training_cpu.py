"""SmolLM2-135M LoRA on the CPU: tokens/s and steps/s with and without packing, peak RSS.

The dataset is the example corpus's SFT bucket, scored and split by the real scorecard. Each
mode runs in its own process (so its peak RSS is its own) through the project's trainer
(TRL SFTTrainer, PEFT LoRA r=8 on all projections, float32, batch 4, max length 256). Packing
fills every row of a batch with real tokens; without it, short examples are padded — the ratio
is what packing buys on this data. One JSON object.

    python bench/training_cpu.py [--steps 12]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one(mode: str, steps: int, dataset: Path, hf_dir: Path, work: Path) -> dict:
    from tasks.training.params import TrainParams, resolve
    from tasks.training.train import Hooks, TrainPaths, device_report, load_splits, train

    recipe = resolve(TrainParams(dataset=str(dataset), method="sft", bucket="bench", overrides={
        "peft": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0}, "max_steps": steps,
        "per_device_train_batch_size": 4, "max_length": 256, "packing": mode == "packed",
        "learning_rate": 1e-3, "logging_steps": 1, "save_steps": 10_000,
        "activation_checkpointing": False, "max_eval_rows": 4, "load_in_4bit": False,
        "export_gguf": False}))
    t = time.perf_counter()
    splits = load_splits(dataset, "sft", recipe.project.max_eval_rows)
    r = train(recipe, splits, device_report(0),
              TrainPaths(hf_dir, work / f"ck-{mode}", work / f"out-{mode}"), Hooks())
    tokens = max((h.get("num_tokens", 0) for h in r.history), default=0)
    return {"mode": mode, "steps": r.steps, "train_seconds": r.seconds,
            "steps_per_s": r.steps_per_second, "tokens": tokens,
            "tokens_per_s": round(tokens / r.seconds, 1) if r.seconds else None,
            "peak_rss_mb": r.peak_mib, "wall_s": round(time.perf_counter() - t, 1)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--one", choices=["packed", "padded"])
    ap.add_argument("--dataset")
    ap.add_argument("--hf")
    ap.add_argument("--work")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.steps, Path(args.dataset), Path(args.hf),
                             Path(args.work))))
        return 0

    from tasks.corpus.scorecard import ScorecardConfig, score_bucket
    from tasks.engine.llama_cpp import default_model_path
    from tasks.training.base_model import hf_from_gguf

    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    _, clean = score_bucket(ROOT / "examples" / "corpus", "engineering-pointsav", "sft",
                            ScorecardConfig(floor=0))
    dataset = work / "sft.parquet"
    clean.write_parquet(dataset)
    cache = ROOT / ".slm-nightly" / "models"
    t = time.perf_counter()
    hf = hf_from_gguf(default_model_path(), cache)
    dequant = round(time.perf_counter() - t, 1)
    results = {}
    for mode in ("padded", "packed"):
        out = subprocess.run([sys.executable, __file__, "--one", mode, "--steps", str(args.steps),
                              "--dataset", str(dataset), "--hf", str(hf), "--work", str(work)],
                             capture_output=True, text=True, check=True)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    p, n = results["packed"], results["padded"]
    print(json.dumps({"bench": "training_cpu", "model": "SmolLM2-135M-Instruct (float32, LoRA r=8)",
                      "rows": clean.height, "dequantize_s": dequant, "padded": n, "packed": p,
                      "tokens_per_s_packed_over_padded": round(p["tokens_per_s"] /
                                                               max(n["tokens_per_s"], 1e-9), 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
