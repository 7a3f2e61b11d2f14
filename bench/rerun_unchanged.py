"""Second run over 1,000 unchanged documents: 0 LLM calls, wall time ≤ 5% of the first run.

The fake endpoint answers in 1 s with 32 slots (a real 32B model is slower still).
    python bench/rerun_unchanged.py
"""

from __future__ import annotations

import time

from _common import phase1_setup, profile, report

from flows.extract import extract

N, LATENCY, SLOTS = 1000, 1.0, 32


def main() -> None:
    with phase1_setup(N, LATENCY) as (tmp, port, url):
        prof = str(profile(tmp, url, port, "rerun", SLOTS, 256))
        extract(profile=prof)  # warm-up: starts Prefect's server, fills nothing we measure
        t = time.perf_counter()
        first = extract(profile=prof, full=True)
        first_s = time.perf_counter() - t
        t = time.perf_counter()
        second = extract(profile=prof)
        second_s = time.perf_counter() - t
    report({"bench": "rerun_unchanged", "documents": N, "latency_s": LATENCY, "slots": SLOTS,
            "first_run_s": round(first_s, 2), "first_run_llm_calls": first["llm_calls"],
            "second_run_s": round(second_s, 2), "second_run_llm_calls": second["llm_calls"],
            "second_skipped": second["documents"]["transcripts"]["skipped"],
            "ratio": round(second_s / first_s, 4),
            "targets": {"second_run_llm_calls": "== 0", "ratio": "<= 0.05"}})


if __name__ == "__main__":
    main()
