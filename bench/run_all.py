"""Run every benchmark (`make bench`), one after the other, and say which ran, which were skipped
and why, and which failed. Exits 1 only when a bench failed.

Each bench is a process of its own; its output passes through as it comes. A bench is:
  ran      it exited 0 and its last line is its JSON figures ({"bench": …});
  skipped  it cannot run on this machine: it exited SKIP (77) or its last line is
           {"bench": …, "skipped": "why"} (e.g. no CUDA GPU);
  failed   anything else (a non-zero exit, or no JSON figures).
The benches share the CPU with nothing else here on purpose: they run serially.

    python bench/run_all.py [NAME ...] [--json results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, SKIP

BENCH = ROOT / "bench"
# Modules the benches import that are not benches themselves (besides bench/_*.py): the
# endpoint simulator serves until killed and prints no figures.
HELPERS = {"run_all.py", "endpoint_sim.py"}


def benches(names: list[str]) -> list[Path]:
    found = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_") and
                   p.name not in HELPERS)
    if not names:
        return found
    unknown = set(names) - {p.stem for p in found}
    if unknown:
        sys.exit(f"bench/run_all.py: no bench named {', '.join(sorted(unknown))} — the benches are "
                 f"{', '.join(p.stem for p in found)}")
    return [p for p in found if p.stem in names]


def last_json(lines: list[str]) -> dict | None:
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
        if line:
            return None
    return None


def run(path: Path) -> tuple[str, str, dict | None, float]:
    """(outcome, why, figures, seconds) of one bench."""
    print(f"\n=== bench/{path.name}", flush=True)
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(path)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    rc = proc.wait()
    seconds = time.perf_counter() - t
    figures = last_json(lines)
    if figures is not None and "skipped" in figures:
        return "skipped", str(figures["skipped"]), figures, seconds
    if rc == SKIP:
        return "skipped", "exited 77 (skip) without saying why", figures, seconds
    if rc != 0:
        return "failed", f"exit status {rc}", figures, seconds
    if figures is None or "bench" not in figures:
        return "failed", "printed no JSON figures ({\"bench\": …}) as its last line", None, seconds
    return "ran", "", figures, seconds


def main() -> int:
    ap = argparse.ArgumentParser(description="Run the benchmarks one after the other.")
    ap.add_argument("names", nargs="*", help="only these benches (file names without .py)")
    ap.add_argument("--json", type=Path, help="also append every bench's JSON figures here")
    args = ap.parse_args()
    results = []
    for path in benches(args.names):
        outcome, why, figures, seconds = run(path)
        results.append((path.stem, outcome, why, seconds))
        if args.json and figures is not None:
            with args.json.open("a") as f:
                f.write(json.dumps({**figures, "outcome": outcome}) + "\n")
    print("\n=== benchmarks")
    for name, outcome, why, seconds in results:
        print(f"  {name:<24} {outcome:<8} {seconds:7.1f} s{'  ' + why if why else ''}")
    counts = {o: sum(1 for r in results if r[1] == o) for o in ("ran", "skipped", "failed")}
    print(f"  {counts['ran']} ran, {counts['skipped']} skipped, {counts['failed']} failed")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
