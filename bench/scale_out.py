"""Scale-out across endpoints: 1, 2 and 4 simulated L4 nodes (bench/endpoint_sim.py, preset
l4-32b-q3, each a process of its own), one LLMClient spreading the work over them (base_url +
more_urls, each endpoint under its own adaptive limit), the same work per endpoint.

Target: documents a second with N endpoints ≥ 0.9 × N × that of one. Goodput is counted to the
moment 90 % of the documents had ended (the final drain left out alike for every run); no
errors, no timeouts (a request whose client gave up is aborted in the simulator and counted
there). Each simulator's own request count shows how evenly the work spread.

    python bench/scale_out.py [--speed 100] [--fixed C]
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from _common import goodput, report, sim_documents, timed_extraction
from endpoint_sim import simulator, stats

from tasks.extraction.llm import LLMClient

PRESET, MODEL = "l4-32b-q3", "olmo-3-32b-think"
CEILING = 64
DOCS_PER_ENDPOINT = 96
TARGET = 0.9


def run(n: int, speed: float, fixed: int | None) -> dict:
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(simulator(PRESET, speed)) for _ in range(n)]
        client = LLMClient(urls[0], MODEL, "vllm", more_urls=tuple(urls[1:]),
                           max_concurrency=fixed or CEILING, adaptive=fixed is None,
                           timeout_seconds=60, max_output_tokens=3072)
        got = timed_extraction(client, sim_documents(DOCS_PER_ENDPOINT * n, f"n{n}-"))
        sims = [stats(u) for u in urls]
    per = client.stats()
    out = {"endpoints": n, "documents": DOCS_PER_ENDPOINT * n,
           "docs_per_s": round(goodput(got["done_at"]), 3), "seconds": round(got["seconds"], 1),
           "errors": len(got["errors"]), "timeouts": sum(s["requests_aborted"] for s in sims),
           "requests_per_endpoint": [s["requests_done"] for s in sims],
           "peak_limit_per_endpoint": [per.get(u, {}).get("peak_limit") for u in urls]}
    if got["errors"]:
        out["first_error"] = got["errors"][0][:300]
    print(f"{n} endpoint(s): {out}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--speed", type=float, default=100.0,
                    help="simulated seconds per real second")
    ap.add_argument("--fixed", type=int, help="a fixed concurrency per endpoint instead of the "
                                              "adaptive limit (to tell pacing from spreading)")
    args = ap.parse_args()
    runs = {n: run(n, args.speed, args.fixed) for n in (1, 2, 4)}
    one = runs[1]["docs_per_s"]
    ratios = {n: round(r["docs_per_s"] / (n * one), 3) for n, r in runs.items() if n > 1}
    errors = sum(r["errors"] + r["timeouts"] for r in runs.values())
    report({"bench": "scale_out", "preset": PRESET, "speed": args.speed,
            "pacing": f"fixed {args.fixed}" if args.fixed else f"adaptive (ceiling {CEILING})",
            "docs_per_endpoint": DOCS_PER_ENDPOINT,
            "docs_per_s": {n: r["docs_per_s"] for n, r in runs.items()},
            "ratio_over_n_times_one": ratios, "runs": runs,
            "errors_and_timeouts": errors,
            "targets": {"ratio_over_n_times_one": f">= {TARGET}",
                        "errors_and_timeouts": "== 0"}})
    missed = [f"{n} endpoints: {r} < {TARGET}" for n, r in ratios.items() if r < TARGET]
    if errors:
        missed.append(f"{errors} errors or timeouts")
    if missed:
        sys.exit(f"scale_out: missed {'; '.join(missed)}")


if __name__ == "__main__":
    main()
