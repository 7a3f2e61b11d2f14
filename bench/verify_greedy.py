"""The llama.cpp half of the adapter verification (tasks/training/verify.py), as it decodes each
prompt: the whole prompt in one decode (what the child does) against one token per decode (what
it did before 2026-12-06), on the F32 copy of SmolLM2-135M the CPU plan verifies on, with the
three default verify prompts in SmolLM2's chat format and 16 greedy tokens each, quiet and with
the other core held busy by a Python busy loop. n_threads = n_threads_batch = 1, as the local
night verifies.

Each row: seconds for the three prompts (best of --repeat), the ratio to the one-token-at-a-time
row of the same load, whether the greedy tokens are the same, and the largest first-token logit
difference between the two ways (the verification compares with HF at a 0.5 bound).

    python bench/verify_greedy.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import report

from tasks.engine.llama_cpp import default_model_path
from tasks.training.base_model import f32_gguf
from tasks.training.params import ProjectFields
from tasks.training.verify import _llama_greedy


def one_token_at_a_time(llm, prompt: list[int], max_tokens: int) -> tuple[list[int], np.ndarray]:
    """The baseline: the child's decode before it sent the prompt in one batch."""
    import llama_cpp

    llm.reset()
    for t in prompt:
        llm.eval([t])
    out: list[int] = []
    first = None
    for _ in range(max_tokens):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                       shape=(llm.n_vocab(),)).copy()
        first = logits if first is None else first
        out.append(int(np.argmax(logits)))
        llm.eval([out[-1]])
    return out, first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from llama_cpp import Llama

    with tempfile.TemporaryDirectory(prefix="verify-greedy-") as tmp:
        base = f32_gguf(default_model_path(), Path(tmp))
        llm = Llama(model_path=str(base), n_ctx=256, n_batch=256, n_threads=1,
                    n_threads_batch=1, seed=0, verbose=False)
        prompts = [llm.tokenize(f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n"
                                .encode(), special=True)
                   for p in ProjectFields().verify_prompts]
        ways = {"one token a decode": lambda p: one_token_at_a_time(llm, p, 16),
                "the prompt in one decode": lambda p: _llama_greedy(llm, p, 16, set())}
        rows = []
        for load in ("quiet", "other core busy"):
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) \
                if load != "quiet" else None
            try:
                got = {}
                for way, run in ways.items():
                    best = float("inf")
                    for _ in range(args.repeat):
                        t0 = time.monotonic()
                        got[way] = [run(p) for p in prompts]
                        best = min(best, time.monotonic() - t0)
                    rows.append({"load": load, "way": way, "seconds": round(best, 2)})
            finally:
                if busy:
                    busy.kill()
            old, new = got.values()
            rows[-1]["ratio"] = round(rows[-1]["seconds"] / rows[-2]["seconds"], 2)
            rows[-1]["same_tokens"] = all(a[0] == b[0] for a, b in zip(old, new, strict=True))
            rows[-1]["first_logit_max_diff"] = round(max(
                float(np.max(np.abs(a[1] - b[1]))) for a, b in zip(old, new, strict=True)), 4)
        llm.close()
    for r in rows:
        print(f"{r['load']:>16}  {r['way']:<26} {r['seconds']:6.2f} s"
              + (f"  {r['ratio']:.2f}x  same tokens: {r['same_tokens']}  first-token logits "
                 f"within {r['first_logit_max_diff']}" if "ratio" in r else ""))
    report({"bench": "verify_greedy", "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
