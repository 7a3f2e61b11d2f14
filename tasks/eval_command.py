"""`slm-nightly eval extraction`: load, run, print, write, gate (flows/cli/evaluation.py parses)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tasks.evaluation.gate import check_comparable, compare, load_baseline
from tasks.evaluation.gold import DEFAULT_GOLD, Split, load_gold
from tasks.evaluation.report import render, render_gate
from tasks.evaluation.runner import Gold, run_eval
from tasks.profile import load_profile
from tasks.runtime import logs
from tasks.shared.files import write_atomic


def _num(v: float | None) -> str:
    return "null" if v is None else f"{v:.3f}"


def default_out(state_dir: Path, split: str) -> Path:
    return state_dir / "eval" / f"extraction-{split}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"


@dataclass(frozen=True)
class EvalOptions:
    """The options of `slm-nightly eval extraction` (flows/cli/evaluation.py): the gold cases
    (`split` of the gold set `gold`; None: evals/extraction/gold.jsonl), the result JSON (None:
    <state_dir>/eval/extraction-<split>-<time>.json), the saved result to gate on and the drop
    it allows (absolute), the endpoint to ask (None: the profile's), and library output on the
    terminal too."""

    split: Split | Literal["all"] = "validation"
    out: str | None = None
    baseline: str | None = None
    tolerance: float = 0.02
    base_url: str | None = None
    gold: str | None = None
    verbose: bool = False


def eval_extraction(profile: str, options: EvalOptions = EvalOptions()) -> int:
    """Run the eval and print its figures; 1 when the baseline's gate fails, else 0.
    Library output goes to <state_dir>/eval/runs/run-<time>.log (tasks/runtime/logs.py)."""
    o = options
    split, out, baseline, tolerance = o.split, o.out, o.baseline, o.tolerance
    base_url, gold, verbose = o.base_url, o.gold, o.verbose
    cfg = load_profile(profile)
    gold_path = Path(gold) if gold else DEFAULT_GOLD
    cases, digest = load_gold(gold_path, split)  # fail fast, before any server starts
    base = load_baseline(Path(baseline)) if baseline else None
    if base is not None:  # refused before anything runs
        check_comparable(base, {"model": cfg.inference.model, "split": split}, Path(baseline or ""))
    with logs.route(cfg.state_dir / "eval", verbose=verbose) as log:
        def say(msg: str) -> None:
            print(msg, file=log.out, flush=True)

        result = run_eval(cfg, profile, Gold(cases, split, gold_path, digest), base_url, say)
        path = Path(out) if out else default_out(cfg.state_dir, split)
        write_atomic(path, json.dumps(result, indent=1, ensure_ascii=False) + "\n")
        say("\n" + render(result))
        say(f"\nresult JSON: {path}\nlog: {log.path}")
        if base is None:
            return 0
        rows = compare(base, result, tolerance)
        say("\n" + render_gate(rows, tolerance, str(baseline)))
        failed = [r for r in rows if not r["passed"]]
        if failed:
            drops = "; ".join(f"{r['figure']} {_num(r['old'])} → {_num(r['new'])}"
                              for r in failed)
            print(f"slm-nightly eval: FAILED the baseline gate (tolerance {tolerance:.3f} "
                  f"absolute): {drops}", file=log.err, flush=True)
            return 1
        say("gate passed")
        return 0
