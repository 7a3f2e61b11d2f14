"""What a user waits for when nothing changed: `slm-nightly run` a second time over the same
documents, each run a new process, as a user starts it.

Two runs of `slm-nightly run --profile P --summary S`, each a fresh process (imports, the
CLI's temporary Prefect server, the embedded FalkorDB opened and compacted, the pipeline):
  first   over N new documents (the baseline: extracts them all),
  second  over the same N documents, unchanged (must make 0 LLM calls).
Each run's time is split by its summary: the phases (`extract` holds the scan, the hash check
and the graph) and what lies outside them (process start, imports, the temporary Prefect
server, the flow's setup and teardown): the fixed cost no change to the incremental logic can
remove. The fake endpoint (bench/_fakes.py) answers in --latency s with 32 slots. The Prefect
database is migrated before the first run, untimed (as on a machine that has run before), in a
PREFECT_HOME of the bench's own.

    python bench/rerun_unchanged.py [--documents 200] [--latency 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import PREFECT, ROOT, fake_endpoint, report, write_documents

SLOTS = 32
CLI = str(Path(sys.executable).parent / "slm-nightly")


def write_profile(path: Path, state: Path, docs: Path, url: str) -> Path:
    path.write_text(f"""
state_dir = "{state}"
[compute]
type = "local"
[inference]
base_url = "{url}"
dialect = "vllm"
model = "fake"
max_concurrent_requests = {SLOTS}
request_timeout_seconds = 60
[graph]
type = "falkordb"
data_dir = "{state / 'graph'}"
graph_name = "rerun"
[sources]
transcripts = "{docs / 'transcripts'}"
[extraction]
batch_documents = 256
""")
    return path


def run(profile: Path, summary: Path, log: Path, env: dict[str, str]) -> dict[str, Any]:
    """One `slm-nightly run` as a new process: its wall time and its summary."""
    t = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run([CLI, "run", "--profile", str(profile), "--summary", str(summary)],
                              cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"rerun_unchanged: `slm-nightly run` exited {proc.returncode}; its output "
                 f"ends:\n{''.join(log.read_text().splitlines(True)[-30:])}")
    s = json.loads(summary.read_text())
    phases = {k: v.get("seconds") for k, v in (s.get("phases") or {}).items()}
    x = s.get("extraction") or {}  # phase 1's report (RunSummary schema 2)
    docs = x.get("documents", {}).get("transcripts", {})
    return {"wall_s": round(wall, 2), "llm_calls": x.get("llm_calls"),
            "extracted": docs.get("extracted"), "skipped": docs.get("skipped"),
            "phases_s": phases,
            "outside_phases_s": round(wall - sum(v or 0 for v in phases.values()), 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--documents", type=int, default=200)
    ap.add_argument("--latency", type=float, default=1.0, help="the fake endpoint's, seconds")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-rerun-"))
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect-home"),
           "PREFECT_LOGGING_LEVEL": "WARNING"}
    env.pop("PREFECT_API_URL", None)  # the CLI starts its own temporary server, as for a user
    try:
        write_documents(tmp / "docs", args.documents)
        subprocess.run([PREFECT, "server", "database", "upgrade", "-y"], env=env, check=True,
                       capture_output=True)
        with fake_endpoint(args.latency) as url:
            prof = write_profile(tmp / "rerun.toml", tmp / "state", tmp / "docs", url)
            first = run(prof, tmp / "first.json", tmp / "first.log", env)
            second = run(prof, tmp / "second.json", tmp / "second.log", env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert first["extracted"] == args.documents and second["skipped"] == args.documents, \
        (first, second)
    report({"bench": "rerun_unchanged", "documents": args.documents, "latency_s": args.latency,
            "slots": SLOTS, "first_run_s": first["wall_s"], "second_run_s": second["wall_s"],
            "second_run_extract_phase_s": second["phases_s"].get("extract"),
            "second_run_outside_phases_s": second["outside_phases_s"],
            "first_run_llm_calls": first["llm_calls"], "second_run_llm_calls": second["llm_calls"],
            "second_skipped": second["skipped"],
            "ratio_second_over_first": round(second["wall_s"] / first["wall_s"], 3),
            "first": first, "second": second,
            "targets": {"second_run_llm_calls": "== 0"}})
    if second["llm_calls"] != 0:
        sys.exit("rerun_unchanged: the second run over unchanged documents called the LLM")


if __name__ == "__main__":
    main()
