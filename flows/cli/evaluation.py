"""`slm-nightly eval extraction` and `eval resolution`: phase 1 measured against gold sets."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from flows.cli.parsing import add_profile, command_group


def _resolution(args: argparse.Namespace) -> int:
    """Resolution on a gold set: figures printed (or JSON), exit 1 under the gate."""
    from tasks.evaluation import resolution

    result = resolution.evaluate(Path(args.gold) if args.gold else resolution.GOLD / "dev")
    short = resolution.gate(result)
    print(json.dumps({**result, "gate": short or "passed"}, indent=2) if args.json
          else resolution.render(result) + "\n" + (
              f"gate FAILED: {'; '.join(short)}" if short else
              f"gate passed (precision ≥ {resolution.PRECISION}, recall ≥ {resolution.RECALL}, "
              "no namesake merged)"))
    return 1 if short else 0


def _eval(args: argparse.Namespace) -> int:
    """Phase 1 on the gold set: figures printed and written as JSON, gated on --baseline."""
    from tasks.eval_command import EvalOptions, eval_extraction

    if args.eval_command == "resolution":
        return _resolution(args)

    return eval_extraction(args.profile, EvalOptions(
        split=args.split, out=args.out, baseline=args.baseline, tolerance=args.tolerance,
        base_url=args.base_url, gold=args.gold, verbose=args.verbose))


def add_eval(sub: Any) -> None:
    evsub = command_group(sub, "eval", "measure phase 1 against a gold set", _eval)
    ev_res = evsub.add_parser("resolution", help="write a gold set of contacts and transcripts "
                              "with known identities through phase 1's resolution (a scratch "
                              "embedded FalkorDB), print pairwise and B-cubed precision and "
                              "recall for people and organizations and the namesakes merged; "
                              "exit 1 under the gate (precision 0.98, recall 0.95, no "
                              "namesake merged)")
    ev_res.add_argument("--gold",
                        help="the gold set's folder (default evals/resolution/dev; report "
                        "evals/resolution/heldout)")
    ev_res.add_argument("--json", action="store_true", help="the figures as JSON")
    ev_ex = evsub.add_parser("extraction", help="run the extraction on the gold set's chunks "
                             "(phase 1's own prompt, schema, parsing and resolution), print "
                             "entity, relationship and grounded precision figures, write them "
                             "as JSON; exit 1 when --baseline's gate fails")
    add_profile(ev_ex)
    ev_ex.add_argument("--split", choices=("train", "validation", "examples", "all"),
                       default="validation", help="the gold cases to run (default validation; "
                       "tune on train)")
    ev_ex.add_argument("--out", help="the result JSON (default: "
                       "<state_dir>/eval/extraction-<split>-<time>.json)")
    ev_ex.add_argument("--baseline", help="a saved result of the same model and split: exit 1 "
                       "when entity F1 or recall (type-strict), relationship F1 or recall, or "
                       "grounded precision drops by more than --tolerance (e.g. "
                       "evals/extraction/baseline-local.json)")
    ev_ex.add_argument("--tolerance", type=float, default=0.02,
                       help="the drop the gate allows, absolute (default 0.02)")
    ev_ex.add_argument("--base-url", help="ask this OpenAI-compatible endpoint (default: the "
                       "profile's base_url, else the profile's local llama-server, started for "
                       "the run and stopped after it)")
    ev_ex.add_argument("--gold", help="the gold set, one JSON case a line (default "
                       "evals/extraction/gold.jsonl)")
    ev_ex.add_argument("--verbose", action="store_true", help="show library output on the "
                       "terminal too (else it goes to <state_dir>/eval/runs/run-<time>.log)")
