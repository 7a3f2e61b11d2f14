"""The benchmark harness: `make bench` tells a skip from a failure, and the scorecard bench's
plain-Python baseline does the same work as the Polars card (so its speedup compares equal
work). The benches themselves are run by `make bench`, not here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
_env = dict(os.environ)

import run_all  # noqa: E402
import scorecard_1m  # noqa: E402

# bench/_common.py sets Prefect's defaults for the benches' own processes: not for this one.
os.environ.clear()
os.environ.update(_env)


@pytest.mark.parametrize(("script", "outcome", "why"), [
    ('print(\'{"bench": "b", "ratio": 2.0}\')', "ran", ""),
    ('import sys; print(\'{"bench": "b", "skipped": "no CUDA GPU"}\'); sys.exit(2)', "skipped",
     "no CUDA GPU"),
    ("import sys; sys.exit(77)", "skipped", "exited 77 (skip) without saying why"),
    ('import sys; print(\'{"bench": "b"}\'); sys.exit(3)', "failed", "exit status 3"),
    ('print("done")', "failed", 'printed no JSON figures ({"bench": …}) as its last line'),
    ('print(\'{"bench": "b"}\'); print("trailing words")', "failed",
     'printed no JSON figures ({"bench": …}) as its last line'),
])
def test_run_all_outcome(tmp_path: Path, script: str, outcome: str, why: str) -> None:
    bench = tmp_path / "b.py"
    bench.write_text(script + "\n")
    got, reason, _, _ = run_all.run(bench)
    assert (got, reason) == (outcome, why)


def test_run_all_lists_every_bench_but_helpers() -> None:
    names = [p.stem for p in run_all.benches([])]
    assert "scorecard_1m" in names and "qlora_7b_shape" in names
    assert not [n for n in names if n.startswith("_") or n == "run_all"]


def test_scorecard_loop_does_the_cards_work(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """On a small generated corpus the loop finds, rule by rule, what the Polars card finds,
    and both find every planted unparseable line, PII row and tie."""
    # The loop hashes words with Python's hash(), salted per process (PYTHONHASHSEED): at 4,000
    # rows a near-duplicate pair or two can move with the salt (about 1 run in 10 broke the
    # 1M-row bench's 2 %), so the small corpus gets 10 %; the exact rules stay exact.
    monkeypatch.setattr(scorecard_1m, "NEAR_TOLERANCE", 0.1)
    made = scorecard_1m.generate(tmp_path, 4000)
    assert made["vocabulary_words"] == 5000
    card, loop = scorecard_1m.run_polars(tmp_path), scorecard_1m.run_loop(tmp_path)
    assert loop["rows"] == card["rows"] == 4000
    assert scorecard_1m.agrees(card["rules"], loop["rules"]), (card["rules"], loop["rules"])
    for rule in ("unparseable", "secrets_pii", "chosen_equals_rejected"):
        assert sum(r[rule] for r in loop["rules"].values()) == made["planted"][rule]
    exact = {b: {k: v for k, v in r.items() if k != "near_duplicate"}
             for b, r in card["rules"].items()}
    assert exact == {b: {k: v for k, v in r.items() if k != "near_duplicate"}
                     for b, r in loop["rules"].items()}


def test_scorecard_agreement_tolerates_only_near_duplicates() -> None:
    card = {"b": {"exact_duplicate": 10, "near_duplicate": 100}}
    assert scorecard_1m.agrees(card, {"b": {"exact_duplicate": 10, "near_duplicate": 98}})
    assert not scorecard_1m.agrees(card, {"b": {"exact_duplicate": 10, "near_duplicate": 97}})
    assert not scorecard_1m.agrees(card, {"b": {"exact_duplicate": 11, "near_duplicate": 100}})
