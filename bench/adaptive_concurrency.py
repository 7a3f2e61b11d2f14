"""Adaptive concurrency against the endpoint simulator (bench/endpoint_sim.py, preset l4-32b-q3:
an L4 serving a 32B Q3 model, run SPEED times faster than real time).

1. A sweep of fixed concurrencies (LLMClient adaptive=False, max_concurrency=c) finds the best
   fixed goodput; then the adaptive client (adaptive=True, max_concurrency=CEILING as a mere
   ceiling) over more documents must reach ≥ 90 % of it, with no timeouts (counted by the
   simulator: a request whose client gave up is aborted there) and no errors.
2. The same when the simulator's capacity halves mid-run (a second tenant takes half the KV
   cache and half the compute, POST /sim/capacity, once HALVE_AFTER documents have ended): a
   sweep of fixed concurrencies through the same halving finds the best fixed goodput from the
   halving on (every client meets the halving with its own requests in flight: a fixed one
   with c, the adaptive one with its full-capacity limit); the adaptive client's goodput from
   the halving on must reach ≥ 90 % of it.
Goodput: documents a second, counted to the moment 90 % of the run's documents had ended (the
final drain, where every client's concurrency must fall, left out alike for every run). Each
run starts on a reset simulator (fresh engine and stats).

    python bench/adaptive_concurrency.py [--speed 400]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from _common import goodput, report, sim_documents, timed_extraction
from endpoint_sim import reset, set_capacity, simulator, stats

from tasks.extraction.llm import LLMClient

PRESET, MODEL = "l4-32b-q3", "olmo-3-32b-think"
CEILING = 64
# Past the knee (full: c ≥ 10; halved: c ≥ 5) the simulator thrashes on recompute preemptions
# and goodput stays flat or falls (measured to c = 16 and c = 8): the sweeps stop there.
FULL_SWEEP, HALVING_SWEEP = (4, 6, 8, 10, 12), (3, 4, 6)
SWEEP_DOCS = 96
ADAPTIVE_DOCS = 320
HALVING_DOCS, HALVE_AFTER = 200, 64  # halve once this many documents have ended
TARGET = 0.9


def client(url: str, limit: int, adaptive: bool) -> LLMClient:
    # timeout_seconds: the fixed client's timeout, and the adaptive one's until it has measured
    # latencies; generous (= 24,000 simulated seconds at speed 400) so the sweep never times out.
    return LLMClient(url, MODEL, "vllm", max_concurrency=limit, adaptive=adaptive,
                     timeout_seconds=60, max_output_tokens=3072)


def run(url: str, limit: int, adaptive: bool, n: int, factor: float = 1.0,
        halve_after: int | None = None) -> dict:
    """One run over the first n of the same documents every run sends (so every run meets the
    same answer lengths)."""
    reset(url)
    if factor != 1.0:
        set_capacity(url, factor)
    c = client(url, limit, adaptive)
    halved: dict = {}
    trace: list[tuple[int, int]] = []  # (documents ended, the adaptive limit then)

    def on_done(_outcome: object, done: int) -> None:
        if adaptive and done % 20 == 0:
            trace.append((done, c.stats()[url]["limit"]))
        if halve_after is not None and done == halve_after:
            halved.update(at=time.perf_counter(), done=done)
            threading.Thread(target=set_capacity, args=(url, factor * 0.5)).start()

    t0 = time.perf_counter()
    got = timed_extraction(c, sim_documents(n, "doc-"), on_done)
    sim = stats(url)
    out = {"docs_per_s": round(goodput(got["done_at"]), 3),
           "output_tokens_per_s": round(sim["completion_tokens"] / got["seconds"], 1),
           "seconds": round(got["seconds"], 1), "errors": len(got["errors"]),
           "timeouts": sim["requests_aborted"], "preemptions": sim["preemptions"],
           "max_running": sim["max_running"], "max_in_flight": sim["max_in_flight"]}
    if got["errors"]:
        out["first_error"] = got["errors"][0][:300]
    if adaptive:
        s = c.stats()[url]
        out.update(limit=s.get("limit"), peak_limit=s.get("peak_limit"), limit_trace=trace)
    if halved:
        since = halved["at"] - t0
        out["after_halving_docs_per_s"] = round(goodput(got["done_at"], since=since,
                                                        first=halved["done"]), 3)
        out["halved_at_s"] = round(since, 1)
    return out


def sweep(url: str, limits: tuple[int, ...], n: int, factor: float,
          halve_after: int | None = None) -> dict[int, dict]:
    found = {}
    for c in limits:
        found[c] = run(url, c, False, n, factor, halve_after)
        print(f"fixed {c:>2} at capacity {factor}"
              f"{f', halved after {halve_after}' if halve_after else ''}: {found[c]}", flush=True)
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default=PRESET, choices=["l4-32b-q3", "l4-32b-q3-llama-server"],
                    help="the simulated server: vLLM's paged cache, or llama-server's slots")
    ap.add_argument("--speed", type=float, default=400.0,
                    help="simulated seconds per real second")
    args = ap.parse_args()
    with simulator(args.preset, args.speed) as url:
        full = sweep(url, FULL_SWEEP, SWEEP_DOCS, 1.0)
        adaptive = run(url, CEILING, True, ADAPTIVE_DOCS)
        print(f"adaptive at capacity 1.0: {adaptive}", flush=True)
        fixed_halving = sweep(url, HALVING_SWEEP, HALVING_DOCS, 1.0, HALVE_AFTER)
        halving = run(url, CEILING, True, HALVING_DOCS, halve_after=HALVE_AFTER)
        print(f"adaptive, capacity halved after {HALVE_AFTER} documents: {halving}", flush=True)
    best_full = max(full, key=lambda c: full[c]["docs_per_s"])
    after = {c: r["after_halving_docs_per_s"] for c, r in fixed_halving.items()}
    best_after = max(after, key=lambda c: after[c])
    ratio = adaptive["docs_per_s"] / full[best_full]["docs_per_s"]
    ratio_half = halving["after_halving_docs_per_s"] / after[best_after]
    timeouts = adaptive["timeouts"] + halving["timeouts"]
    errors = adaptive["errors"] + halving["errors"]
    report({"bench": "adaptive_concurrency", "preset": args.preset, "speed": args.speed,
            "ceiling": CEILING,
            "sweep": {c: r["docs_per_s"] for c, r in full.items()},
            "best_fixed": {"concurrency": best_full, **full[best_full]},
            "adaptive": adaptive, "ratio_adaptive_over_best_fixed": round(ratio, 3),
            "sweep_through_halving_after": after,
            "best_fixed_through_halving": {"concurrency": best_after,
                                           **fixed_halving[best_after]},
            "adaptive_halving": halving,
            "ratio_after_halving_over_best_fixed_halved": round(ratio_half, 3),
            "timeouts": timeouts, "errors": errors,
            "targets": {"ratio_adaptive_over_best_fixed": f">= {TARGET}",
                        "ratio_after_halving_over_best_fixed_halved": f">= {TARGET}",
                        "timeouts": "== 0", "errors": "== 0"}})
    missed = [name for name, ok in (("goodput", ratio >= TARGET),
                                    ("goodput after halving", ratio_half >= TARGET),
                                    ("no timeouts", timeouts == 0), ("no errors", errors == 0))
              if not ok]
    if missed:
        sys.exit(f"adaptive_concurrency: missed {', '.join(missed)}")


if __name__ == "__main__":
    main()
