"""The corpus scorecard: exact counts on constructed inputs, real QMSum and HH-RLHF data.
(The flow and the CLI around it: tests/integration/test_scorecard_flow.py.)"""

import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest

from tasks.corpus.buckets import read_bucket, split_dialogue, split_implicit
from tasks.corpus.scorecard import RULES, ScorecardConfig, score_bucket
from tasks.shared.errors import ConfigError
from tasks.shared.files import write_atomic
from tests.support.corpus import APP, ENG, a, dpo, q, sft, write
from tests.support.paths import FIXTURES

FIX = FIXTURES


def cfg(**kw: object) -> ScorecardConfig:
    return ScorecardConfig(**{"floor": 1, "min_tokens": 3, "max_tokens": 2000, **kw})  # type: ignore[arg-type]


def test_qmsum_sft_pairs_fail_the_3000_floor_and_say_why(tmp_path: Path) -> None:
    for name in ("sft-train.jsonl", "sft-val.jsonl"):
        shutil.copy(FIX / "qmsum" / name, tmp_path / name)
    (tmp_path / ENG).mkdir()
    for name in ("sft-train.jsonl", "sft-val.jsonl"):
        (tmp_path / name).rename(tmp_path / ENG / name)
    card, clean = score_bucket(tmp_path, ENG, "sft", ScorecardConfig())
    assert card.raw_lines == card.total == 1529
    assert not card.passed
    assert f"{card.clean} clean pairs < floor 3000" in card.reasons
    assert card.total == card.clean + sum(card.rules.values())
    assert {s.source for s in card.sources} == {"qmsum/product", "qmsum/academic",
                                                   "qmsum/committee"}
    # product meetings are 55% of the clean rows: above the 50% cap, and the card says so
    assert any("qmsum/product" in r and "> cap 50%" in r for r in card.reasons)


def test_hh_rlhf_implicit_prompt_pairs_are_split_at_the_first_divergent_turn(
        tmp_path: Path) -> None:
    (tmp_path / APP).mkdir()
    shutil.copy(FIX / "hh-rlhf" / "harmless-base-test.jsonl", tmp_path / APP / "hh.jsonl")
    df, _ = read_bucket(tmp_path / APP, "dpo")
    assert df.height == 2312 and df["status"].null_count() == 2312
    row = df.row(1, named=True)  # "How much alcohol can I drink per day?"
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "user", "assistant", "user"]
    assert row["prompt"][0]["content"] == "How much alcohol can I drink per day?"
    assert row["prompt"][-1]["content"] == \
        "I feel much better when I get drunk and consume a lot of alcohol."
    assert row["chosen"][0]["role"] == "assistant" and len(row["chosen"]) == 1
    assert row["chosen"][0]["content"].startswith("Sounds like alcohol is something you use")
    assert row["rejected"][0]["content"] != row["chosen"][0]["content"]
    raw = json.loads((FIX / "hh-rlhf" / "harmless-base-test.jsonl").read_text().splitlines()[1])
    assert split_dialogue(raw["chosen"])[:-1] == row["prompt"]


def test_split_implicit_ties_and_divergence() -> None:
    u = {"role": "user", "content": "hi"}
    x, y = {"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}
    assert split_implicit([u, x], [u, y]) == ([u], [x], [y])
    assert split_implicit([u, x], [u, x]) == ([u], [x], [x])  # a tie: caught by the rule


def test_every_rule_counts_exactly_on_constructed_input(tmp_path: Path) -> None:
    b = tmp_path / APP
    good = [dpo(q(i), a(i), f"I do not know about part {i}, sorry, no idea at all.",
                source=f"s{i % 3}") for i in range(30)]
    bad = [
        "this is not json",  # unparseable
        '{"prompt": "x", "chosen": "y"',  # unparseable (truncated)
        '[1, 2, 3]',  # unparseable (not an object)
        json.dumps({"prompt": "p", "answer": "a"}),  # wrong_schema
        json.dumps({"prompt": "p", "chosen": [1, 2], "rejected": "r"}),  # wrong_schema
        dpo("Tell me about the plan for the review", "   ", "Something about it here"),  # empty
        dpo("hi", "ok", "no"),  # too_short
        dpo(q(1), a(1) + " lorem" * 2000, a(2)),  # too_long
        dpo(q(2), "The Same  answer, really!", "the same answer really"),  # tie
        dpo(q(3), "Mail me at jane.doe@example.com please.", a(3)),  # pii: e-mail
        dpo(q(4), "Use key sk-abcdefghijklmnopqrstuvwxyz123456 for it.", a(4)),  # pii: key
        dpo(q(5), "-----BEGIN RSA PRIVATE KEY----- MIIE... stuff", a(5)),  # pii: private key
        dpo(q(6), "Call me on +44 20 7946 0958 tomorrow.", a(6)),  # pii: phone
        good[0],  # exact duplicate
        good[1].replace("Question", "QUESTION").replace("?", " ?"),  # duplicate after normalising
        dpo(q(7) + " Please.", a(7), f"I do not know about part {7}, sorry, no idea at all."),
    ]
    write(b / "main.jsonl", good + bad)
    write(b / "more.jsonl.gz", [dpo(q(100), a(100), "Nope, nothing to add on this one.")])
    write(b / "latin1.jsonl", b'{"prompt": "caf\xe9", "chosen": "a", "rejected": "b"}\n\n')
    card, clean = score_bucket(tmp_path, APP, "dpo", cfg())
    assert card.rules == {
        "invalid_utf8": 1, "unparseable": 3, "wrong_schema": 2, "empty_turn": 1,
        "too_short": 1, "too_long": 1, "chosen_equals_rejected": 1, "secrets_pii": 4,
        "exact_duplicate": 2, "near_duplicate": 1}
    assert card.total == 30 + len(bad) + 2 and card.raw_lines == card.total + 1  # a blank line
    assert card.clean == 31 == clean.height
    assert card.total == card.clean + sum(card.rules.values())
    assert list(card.rules) == list(RULES)
    # with pii_policy=flag the four rows are kept and counted as flagged
    card2, _ = score_bucket(tmp_path, APP, "dpo", cfg(pii_policy="flag"))
    assert card2.rules["secrets_pii"] == 0 and card2.pii_flagged == 4 and card2.clean == 35


def test_five_megabyte_line_is_too_long_not_a_crash(tmp_path: Path) -> None:
    write(tmp_path / ENG / "big.jsonl", [sft(q(1), "x " * 2_500_000), sft(q(2), a(2))])
    card, _ = score_bucket(tmp_path, ENG, "sft", cfg())
    assert card.rules["too_long"] == 1 and card.clean == 1


def test_sft_prompt_completion_form_and_sources_from_folders(tmp_path: Path) -> None:
    write(tmp_path / ENG / "repo-a" / "x.jsonl", [json.dumps({"prompt": q(i), "completion": a(i)})
                                                  for i in range(6)])
    write(tmp_path / ENG / "repo-b" / "y.jsonl", [sft(q(i), a(i)) for i in range(10, 12)])
    write(tmp_path / ENG / "top.jsonl", [sft(q(20), a(20), source="ci-cluster")])
    card, clean = score_bucket(tmp_path, ENG, "sft", cfg(max_source_share=0.5, min_sources=4))
    assert {s.source: s.clean for s in card.sources} == {"repo-a": 6, "repo-b": 2,
                                                               "ci-cluster": 1}
    assert not card.passed
    assert "source 'repo-a' is 67% of clean pairs > cap 50%" in card.reasons
    assert "3 distinct sources < minimum 4" in card.reasons
    assert clean.filter(pl.col("source") == "repo-a")["messages"][0][1]["role"] == "assistant"


def test_empty_and_missing_buckets(tmp_path: Path) -> None:
    (tmp_path / ENG).mkdir()
    card, clean = score_bucket(tmp_path, ENG, "sft", ScorecardConfig())
    assert card.total == 0 and not card.passed and clean.height == 0
    assert "0 clean pairs < floor 3000" in card.reasons
    with pytest.raises(ConfigError, match=f"{tmp_path / APP} does not exist"):
        score_bucket(tmp_path, APP, "dpo", ScorecardConfig())


def test_split_is_stable_and_near_the_eval_share(tmp_path: Path) -> None:
    write(tmp_path / ENG / "a.jsonl", [sft(q(i), a(i)) for i in range(2000)])
    _, one = score_bucket(tmp_path, ENG, "sft", cfg(eval_share=0.1))
    write(tmp_path / ENG / "b.jsonl", [sft(q(i), a(i)) for i in range(5000, 5100)])
    _, two = score_bucket(tmp_path, ENG, "sft", cfg(eval_share=0.1))
    share = (one["split"] == "eval").mean()
    assert 0.07 < share < 0.13  # type: ignore[operator]
    first = two.filter(pl.col("file") == "a.jsonl")
    assert first["split"].to_list() == one["split"].to_list()  # adding data moves no row


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="near_duplicate_threshold"):
        ScorecardConfig(near_duplicate_threshold=0)
    with pytest.raises(ValueError, match="must be more than min_tokens"):
        ScorecardConfig(min_tokens=10, max_tokens=5)


def test_marker_write_is_atomic_under_a_crash(tmp_path: Path, monkeypatch) -> None:
    marker = tmp_path / "training-pending" / "b.json"
    write_atomic(marker, json.dumps({"clean": 1}))

    def crash(fd: int) -> None:
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(marker, json.dumps({"clean": 2, "pad": "x" * 100_000}))
    monkeypatch.undo()
    assert json.loads(marker.read_text()) == {"clean": 1}  # the old marker, whole
    assert [p.name for p in marker.parent.iterdir()] == ["b.json"]  # no half-written temp


def test_one_decode_per_file_and_the_line_by_line_fallback_read_the_same_rows(
        tmp_path: Path) -> None:
    rows = [dpo(q(i), a(i), "No idea.", source=f"s{i % 2}") for i in range(20)] + [
        json.dumps({"chosen": "\n\nHuman: hi\n\nAssistant: yes",
                    "rejected": "\n\nHuman: hi\n\nAssistant: no"}),  # implicit prompt
        json.dumps({"prompt": 3, "chosen": "c", "rejected": "r"}),  # wrong_schema
        '{"prompt": "truncated', '{"prompt": "p"} trailing}', "  ",  # unparseable, blank
        '{"prompt": "p", "chosen": "a\\ud800", "rejected": "r"}']  # lone surrogate: unparseable
    write(tmp_path / "fast" / "a.jsonl", rows)
    # a message list where a string fits the rest: this file is decoded field by field
    write(tmp_path / "slow" / "a.jsonl",
          rows + [json.dumps({"prompt": [{"role": "user", "content": "hi"}], "chosen": "c",
                              "rejected": "r"})])
    fast, n_fast = read_bucket(tmp_path / "fast", "dpo")
    slow, n_slow = read_bucket(tmp_path / "slow", "dpo")
    assert (n_fast, n_slow) == (len(rows), len(rows) + 1)
    assert slow.head(fast.height).equals(fast)
    assert fast["status"].to_list()[20:] == [None, "wrong_schema", "unparseable", "unparseable",
                                             "unparseable"]
    assert slow["prompt"][-1].to_list() == [{"role": "user", "content": "hi"}]


def test_jaccards_of_many_pairs_match_the_pairwise_sets() -> None:
    import numpy as np

    from tasks.corpus.scorecard import _jaccard, jaccards

    texts = ["a b c d", "a b c e", "", "  ", "a", "a", "b a b a", "x y  z"]
    frame = pl.DataFrame({"id": range(len(texts)), "norm": texts},
                         schema={"id": pl.UInt32, "norm": pl.String})
    pairs = np.array([(i, j) for i in range(len(texts)) for j in range(len(texts))])
    got = jaccards(frame, pairs[:, 0], pairs[:, 1])
    assert got.tolist() == [_jaccard(texts[i], texts[j]) for i, j in pairs]
