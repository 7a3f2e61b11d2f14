"""Phase 1 inside its budget, on the endpoint simulator (bench/endpoint_sim.py, preset l4-32b-q3
in a process of its own, SPEED times faster than real time).

In one run:
1. the simulator's capacity: a short sweep of fixed concurrencies (LLMClient adaptive=False)
   over documents of the same size finds the best documents-a-second rate;
2. the real phase-1 flow (flows.extract.extract, an embedded FalkorDB, Prefect's temporary
   server warmed up first, untimed) over about twice the documents that rate could extract in
   BUDGET seconds, with budget_seconds=BUDGET and the shipped profile's batch size (64).
Targets: the flow ends `partial`, within 2 % of its budget (its own `seconds`, from the flow's
start to its summary; the wall time around the call is reported beside it), having extracted
≥ 90 % of best rate × budget, with no failures and no timeouts (counted by the simulator: a
request whose client gave up is aborted there).

    python bench/deadline.py [--speed 200] [--budget 40]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import goodput, report, sim_documents, timed_extraction
from endpoint_sim import reset, simulator, stats

from tasks.extraction.llm import LLMClient

PRESET, MODEL = "l4-32b-q3", "olmo-3-32b-think"
SWEEP, SWEEP_DOCS = (6, 8, 10), 64
CEILING = 64
ON_TIME, SHARE = 0.02, 0.9


def write_corpus(root: Path, n: int) -> None:
    """n transcripts of the size the sweep sends (sim_documents' text, with front matter)."""
    t = root / "transcripts"
    t.mkdir(parents=True)
    for d in sim_documents(n, "night-"):
        (t / f"{d.id.split('/')[-1]}").write_text(
            f"---\nmeeting_id: {d.hash}\n---\n# Meeting {d.hash}\n\n{d.text}\n")


def write_profile(path: Path, tmp: Path, url: str, port: int, graph: str, docs: Path,
                  speed: float) -> str:
    # The shipped request_timeout_seconds (300 s) in simulated time: the timeout until latencies
    # are measured, and the deadline gate's estimate of a request's latency until then.
    path.write_text(f"""
state_dir = "{tmp / ('state-' + graph)}"
[inference]
base_url = "{url}"
dialect = "vllm"
model = "{MODEL}"
max_concurrent_requests = {CEILING}
request_timeout_seconds = {300 / speed:.3f}
context_tokens = 8192
max_output_tokens = 3072
[graph]
type = "falkordb"
host = "127.0.0.1"
port = {port}
graph_name = "{graph}"
[sources]
transcripts = "{docs / 'transcripts'}"
[extraction]
batch_documents = 64
""")
    return str(path)


def capacity(url: str) -> tuple[int, float, dict[int, float]]:
    """The best fixed concurrency and its documents a second (and the sweep)."""
    rates = {}
    for c in SWEEP:
        reset(url)
        client = LLMClient(url, MODEL, "vllm", max_concurrency=c, adaptive=False,
                           timeout_seconds=60, max_output_tokens=3072)
        got = timed_extraction(client, sim_documents(SWEEP_DOCS, f"cap{c}-"))
        assert not got["errors"], got["errors"][:2]
        rates[c] = round(goodput(got["done_at"]), 3)
        print(f"fixed {c}: {rates[c]} documents/s", flush=True)
    best = max(rates, key=lambda c: rates[c])
    return best, rates[best], rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default=PRESET, choices=["l4-32b-q3", "l4-32b-q3-llama-server"],
                    help="the simulated server: vLLM's paged cache, or llama-server's slots")
    ap.add_argument("--speed", type=float, default=200.0,
                    help="simulated seconds per real second")
    ap.add_argument("--budget", type=float, default=40.0, help="phase 1's budget, seconds")
    args = ap.parse_args()
    from flows.extract import extract
    from tasks.graph import falkordb_server

    tmp = Path(tempfile.mkdtemp(prefix="bench-deadline-"))
    rec, _ = falkordb_server.start(tmp / "graph")
    try:
        with simulator(args.preset, args.speed) as url:
            best, rate, sweep = capacity(url)
            allowed = rate * args.budget
            n = int(2 * allowed)
            write_corpus(tmp / "warm", 2)
            write_corpus(tmp / "night", n)
            reset(url)
            extract(profile=write_profile(tmp / "warm.toml", tmp, url, rec.port, "warm",
                                          tmp / "warm", args.speed))  # Prefect's server, imports: untimed
            reset(url)
            prof = write_profile(tmp / "night.toml", tmp, url, rec.port, "night", tmp / "night",
                                 args.speed)
            t = time.perf_counter()
            summary = extract(profile=prof, budget_seconds=args.budget)
            wall = time.perf_counter() - t
            sim = stats(url)
    finally:
        falkordb_server.stop(tmp / "graph")
        shutil.rmtree(tmp, ignore_errors=True)
    docs = summary.documents["transcripts"]
    seconds = summary.seconds
    late = seconds / args.budget - 1
    share = docs.extracted / allowed
    ok = {"partial": summary.status == "partial", "on time": abs(late) <= ON_TIME,
          "share of capacity": share >= SHARE,
          "no failures": docs.failed == 0 and sim["requests_aborted"] == 0}
    report({"bench": "deadline", "preset": args.preset, "speed": args.speed,
            "budget_s": args.budget, "documents": n, "sweep": sweep,
            "best_fixed": {"concurrency": best, "docs_per_s": rate},
            "capacity_in_budget_docs": round(allowed, 1),
            "status": summary.status, "flow_seconds": seconds, "wall_s": round(wall, 2),
            "off_budget": round(late, 4), "extracted": docs.extracted,
            "pending": sum(summary.pending.values()),
            "failed": docs.failed, "timeouts": sim["requests_aborted"],
            "share_of_capacity": round(share, 3),
            "extract_seconds": summary.extract_seconds,
            "endpoints": json.loads(json.dumps(summary.endpoints)),
            "targets": {"status": "partial", "off_budget": f"within ±{ON_TIME}",
                        "share_of_capacity": f">= {SHARE}", "failed": "== 0",
                        "timeouts": "== 0"}})
    missed = [k for k, v in ok.items() if not v]
    if missed:
        sys.exit(f"deadline: missed {', '.join(missed)}")


if __name__ == "__main__":
    main()
