"""llama.cpp's CPU threads on this machine, quiet and with one core held busy by another process
(a plain Python busy loop): prompt evaluation and decoding speed of SmolLM2-135M at each thread
count, for the installed library (OpenMP, llama.cpp's default) and for any other build of the
same source given with --lib NAME=DIR (e.g. one with -DGGML_OPENMP=OFF: ggml's own thread pool).

Each measurement is a fresh child process (the library's thread pool is per process); the busy
loop starts before it and runs through it. Ratios are against the first row measured (quiet,
the installed library, 1 thread) in the same run.

    python bench/engine_threads.py [--lib NAME=DIR ...] [--threads 1 2] [--tokens 48]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from _common import ROOT

sys.path.insert(0, str(ROOT))
from tasks.engine.llama_cpp import CHECK_TEXT, default_model_path  # noqa: E402

CHILD = r"""
import json, sys, time
import llama_cpp
model = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=1024, n_batch=512,
                        n_threads=int(sys.argv[2]), logits_all=False, verbose=False)
tokens = model.tokenize(sys.argv[3].encode())
t0 = time.monotonic()
model.eval(tokens)
t1 = time.monotonic()
out = 0
for tok in model.generate([], temp=0.0, reset=False):
    out += 1
    if out >= int(sys.argv[4]):
        break
t2 = time.monotonic()
print(json.dumps({"prompt_tokens": len(tokens), "prompt_tok_s": round(len(tokens) / (t1 - t0), 1),
                  "decode_tok_s": round(out / (t2 - t1), 1), "generated": out}))
"""


def measure(lib: str | None, threads: int, tokens: int, timeout: float) -> dict:
    env = {**os.environ}
    if lib:
        env["LLAMA_CPP_LIB_PATH"] = lib
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, str(default_model_path()),
                            str(threads), CHECK_TEXT, str(tokens)], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"timed_out_s": timeout}
    if r.returncode != 0:
        return {"error": r.stderr.strip()[-300:]}
    return json.loads(r.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", action="append", default=[],
                    help="NAME=DIR: another llama.cpp lib folder (LLAMA_CPP_LIB_PATH)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--timeout", type=float, default=180.0)
    args = ap.parse_args()
    libs: list[tuple[str, str | None]] = [("installed", None)]
    libs += [tuple(x.split("=", 1)) for x in args.lib]  # type: ignore[misc]
    rows = []
    for load in ("quiet", "busy"):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) \
            if load == "busy" else None
        try:
            for name, lib in libs:
                for t in args.threads:
                    row = {"load": load, "lib": name, "threads": t,
                           **measure(lib, t, args.tokens, args.timeout)}
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    base = rows[0]
    for r in rows:
        for k in ("prompt_tok_s", "decode_tok_s"):
            if k in r and k in base:
                r[k.replace("_tok_s", "_ratio")] = round(r[k] / base[k], 3)
    print(json.dumps({"bench": "engine_threads", "cores": os.cpu_count(),
                      "baseline": "quiet, installed library, 1 thread", "rows": rows}))


if __name__ == "__main__":
    main()
