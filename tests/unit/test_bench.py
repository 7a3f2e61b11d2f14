"""The benchmark harness: `make bench` tells a skip from a failure, and the scorecard bench's
plain-Python baseline does the same work as the Polars card (so its speedup compares equal
work). The benches themselves are run by `make bench`, not here."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

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
    assert {"adaptive_concurrency", "scale_out", "deadline"} <= set(names)
    assert not [n for n in names if n.startswith("_") or n in ("run_all", "endpoint_sim")]


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


def _engine(kv_tokens: int, budget: int, slots: int = 8, slot_tokens: int | None = None
            ) -> tuple[Any, Any]:
    import asyncio

    import endpoint_sim

    preset = endpoint_sim.Preset("m", step_base_s=0.1, step_per_seq_s=0.0,
                                 kv_read_s_per_token=0.0, prefill_tokens_per_s=100.0,
                                 kv_tokens=kv_tokens, max_num_seqs=slots,
                                 max_batched_tokens=budget, max_model_len=4096,
                                 output_tokens=(1, 1), slot_tokens=slot_tokens)
    loop = asyncio.new_event_loop()
    return endpoint_sim.Engine(preset), lambda prompt, target: endpoint_sim.Request(
        prompt, target, 0.0, loop.create_future())


def test_simulator_prefills_in_chunks_then_writes_a_token_a_step() -> None:
    """A 40-token prompt under a 32-token step budget: 0.1 + 32/100 s, then 0.1 + 8/100 s (the
    last chunk writes the first token), then two decode steps of 0.1 s: done at 0.80 s."""
    engine, request = _engine(kv_tokens=1024, budget=32)
    req = request(40, 3)
    engine.add(req)
    engine.advance(0.79)
    assert not req.done.done() and req.generated == 2
    engine.advance(10.0)
    assert req.done.result() == pytest.approx(0.80)
    assert (engine.stats.steps, engine.stats.completion_tokens, engine.used_blocks) == (4, 3, 0)


def test_simulator_preempts_the_newest_request_when_the_cache_is_full() -> None:
    """Two 16-token prompts fill a 32-token cache (two blocks of 16); the first one's 17th token
    needs a block, so the newer one is preempted (vLLM V1, FCFS), recomputed after, and both end."""
    engine, request = _engine(kv_tokens=32, budget=64)
    a, b = request(16, 10), request(16, 10)
    engine.add(a)
    engine.add(b)
    engine.advance(0.3)  # step 1 (0.42 s) not yet over
    assert engine.stats.steps == 0
    engine.advance(0.42 + 0.1)  # step 1, then step 2 preempts b
    assert engine.stats.preemptions == 1 and list(engine.waiting) == [b] and b.computed == 0
    engine.advance(100.0)
    assert a.done.done() and b.done.done() and a.done.result() < b.done.result()
    assert engine.stats.recomputed_tokens == 16 and engine.used_blocks == 0


def test_llama_server_slots_queue_the_third_request_and_never_preempt() -> None:
    """Two slots of 32 tokens (llama-server -np 2 -c 64): the same two prompts that overflow a
    paged 32-token cache run side by side without a preemption; a third waits for a slot
    (no 429) and starts when the first ends."""
    engine, request = _engine(kv_tokens=64, budget=64, slots=2, slot_tokens=32)
    a, b, c = request(16, 10), request(16, 10), request(16, 10)
    for r in (a, b, c):
        engine.add(r)
    engine.advance(0.42 + 0.1)
    assert engine.stats.preemptions == 0 and list(engine.waiting) == [c]
    engine.advance(100.0)
    assert a.done.result() == b.done.result() < c.done.result()
    assert engine.stats.preemptions == 0 and engine.stats.queue_wait_max == a.done.result()
