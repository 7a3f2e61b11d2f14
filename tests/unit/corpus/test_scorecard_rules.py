"""The scorecard's rules at their boundaries, one rule at a time, on tiny buckets written to a
temporary folder: token bounds (3.5 characters a token), ties, PII, duplicates, the order rows
are charged in, and the bucket verdict (floor, source cap, minimum sources)."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tasks.corpus.scorecard import RULES, ScorecardConfig, score_bucket, scorecard_of
from tasks.records import BucketScore

B = "bucket"


def sft(q: str, a: str, source: str = "s") -> str:
    return json.dumps({"messages": [{"role": "user", "content": q},
                                    {"role": "assistant", "content": a}], "source": source})


def dpo(p: str, c: str, r: str, source: str = "s") -> str:
    return json.dumps({"prompt": p, "chosen": c, "rejected": r, "source": source})


def words(i: int, n: int = 6) -> str:
    """A distinct sentence per i (no bigram shared with another i)."""
    return " ".join(f"w{i}x{k}" for k in range(n))


def card(tmp_path: Path, lines: list[str], kind: str = "sft", **kw: object) -> BucketScore:
    (tmp_path / B).mkdir(exist_ok=True)
    (tmp_path / B / "a.jsonl").write_text("\n".join(lines) + "\n")
    cfg = ScorecardConfig(**{"floor": 0, "min_tokens": 1, "max_tokens": 1000, "max_source_share": 1,
                             **kw})  # type: ignore[arg-type]
    return score_bucket(tmp_path, B, kind, cfg)[0]  # type: ignore[arg-type]


def failures(c: BucketScore) -> dict[str, int]:
    return {r: n for r, n in c.rules.items() if n}


def test_min_tokens_boundary(tmp_path: Path) -> None:
    # 14 content characters = 4 tokens exactly: kept; 13 = 3.71 tokens: too short
    c = card(tmp_path, [sft("q" * 7, "a" * 7), sft("r" * 7, "b" * 6)], min_tokens=4)
    assert failures(c) == {"too_short": 1} and c.clean == 1


def test_max_tokens_boundary(tmp_path: Path) -> None:
    # 35 characters = 10 tokens: kept; 36: too long
    c = card(tmp_path, [sft("q" * 20, "a" * 15), sft("r" * 20, "b" * 16)], max_tokens=10)
    assert failures(c) == {"too_long": 1} and c.clean == 1


def test_an_empty_or_blank_turn_fails_before_the_token_rules(tmp_path: Path) -> None:
    c = card(tmp_path, [sft(words(1), " \n\t"), sft("", words(2)), sft(words(3), words(4))],
             min_tokens=1000, max_tokens=2000)
    assert failures(c) == {"empty_turn": 2, "too_short": 1}


def test_chosen_equal_to_rejected_after_case_and_punctuation_only(tmp_path: Path) -> None:
    p = words(0)
    c = card(tmp_path, [dpo(p, "Yes, it is DONE.", "yes it is done"),
                        dpo(words(1), "It is done", "It is done now"),  # a prefix: no tie
                        dpo(words(2), "It is done", "It is dome"),
                        dpo(words(3), "Ünïcode Ok", "ünïcode ok!"),
                        dpo(words(4), "yes it is done", "Yes, it is DONE."),  # either side
                        # past the 64 characters compared first, punctuation shifts the keys
                        dpo(words(5), "a, b. " * 20 + "end", "ab" * 20 + " end"),
                        dpo(words(6), "ab" * 20 + " end", "a, b. " * 20 + "end"),
                        dpo(words(7), "a, b. " * 20 + "end", "ab" * 20 + " fin"),
                        dpo(words(8), "yes it is done", '"Yes, it is done"')], kind="dpo")
    assert failures(c) == {"chosen_equals_rejected": 6} and c.clean == 3


@pytest.mark.parametrize("secret", [
    "mail jane.doe@example.org now", "call +1 613-555-0199 today", "key AKIAABCDEFGHIJKLMNOP",
    "token ghp_" + "a" * 36, "-----BEGIN PRIVATE KEY-----", "use sk-" + "x" * 24])
def test_each_kind_of_secret_or_pii_is_dropped_or_flagged(tmp_path: Path, secret: str) -> None:
    lines = [sft(words(1), secret), sft(words(2), words(3))]
    dropped = card(tmp_path, lines)
    assert failures(dropped) == {"secrets_pii": 1} and dropped.pii_flagged == 0
    flagged = card(tmp_path, lines, pii_policy="flag")
    assert failures(flagged) == {} and flagged.pii_flagged == 1 and flagged.clean == 2


def test_lookalikes_are_no_pii(tmp_path: Path) -> None:
    c = card(tmp_path, [sft(words(1), "version 1.2.3 at 10:30, see user@host"),
                        sft(words(2), "sk-short and AKIA123")])
    assert failures(c) == {} and c.pii_flagged == 0


def test_the_first_copy_is_kept_and_later_ones_are_exact_duplicates(tmp_path: Path) -> None:
    a, b = sft(words(1), words(2)), sft(words(3), words(4))
    loud = sft(words(1).upper() + "!", words(2) + " .")  # equal after normalising
    c = card(tmp_path, [a, b, a, loud, b])
    assert failures(c) == {"exact_duplicate": 3} and c.clean == 2


def test_a_row_is_charged_to_its_first_failing_rule_only(tmp_path: Path) -> None:
    short = sft("hi", "ok")
    c = card(tmp_path, [short, short, sft(words(1), "x@example.com " + words(2)),
                        sft(words(1), "x@example.com " + words(2))], min_tokens=3)
    # the short copies are too short, not duplicates; the PII copies are PII, not duplicates
    assert failures(c) == {"too_short": 2, "secrets_pii": 2}
    assert c.total == c.clean + sum(c.rules.values()) == 4


def test_near_duplicates_are_only_sought_among_clean_rows(tmp_path: Path) -> None:
    q, a = words(1, 20), words(2, 40)
    c = card(tmp_path, [sft(q, a), sft(q, a + " extra"), sft(q, a + " x@example.com")])
    assert failures(c) == {"near_duplicate": 1, "secrets_pii": 1} and c.clean == 1
    assert list(c.rules) == list(RULES)


def test_the_floor_is_met_by_exactly_floor_clean_pairs(tmp_path: Path) -> None:
    lines = [sft(words(i), words(100 + i)) for i in range(3)]
    assert card(tmp_path, lines, floor=3).passed
    c = card(tmp_path, lines, floor=4)
    assert not c.passed and c.reasons == ["3 clean pairs < floor 4"]


def test_a_source_at_exactly_the_cap_passes(tmp_path: Path) -> None:
    lines = [sft(words(i), words(100 + i), source="a" if i < 2 else "b") for i in range(4)]
    ok = card(tmp_path, lines, max_source_share=0.5, min_sources=2)
    assert ok.passed and ok.reasons == []
    assert [(s.source, s.clean, s.share_of_clean) for s in ok.sources] == [
        ("a", 2, 0.5), ("b", 2, 0.5)]
    over = card(tmp_path, lines + [sft(words(9), words(109), source="a")],
                max_source_share=0.5, min_sources=3)
    assert over.reasons == ["2 distinct sources < minimum 3",
                            "source 'a' is 60% of clean pairs > cap 50%"]


def test_a_source_with_no_clean_row_is_no_distinct_source(tmp_path: Path) -> None:
    c = card(tmp_path, [sft(words(1), words(2), source="a"), sft("hi", "ok", source="b")],
             min_tokens=3, min_sources=2)
    assert c.reasons == ["1 distinct sources < minimum 2"]
    assert [(s.source, s.total, s.clean) for s in c.sources] == [("a", 1, 1),
                                                                          ("b", 1, 0)]


def test_the_digest_follows_the_clean_rows_not_their_order(tmp_path: Path) -> None:
    rows = [sft(words(i), words(100 + i)) for i in range(4)]
    one = card(tmp_path, rows).digest
    assert card(tmp_path, rows[::-1]).digest == one
    assert card(tmp_path, rows + [sft("hi", "ok")], min_tokens=3).digest == one  # not clean
    assert card(tmp_path, rows[:3]).digest != one


@pytest.mark.parametrize(("kw", "where", "message"), [
    ({"floor": -1}, "floor", "Input should be greater than or equal to 0"),
    ({"min_tokens": -1}, "min_tokens", "Input should be greater than or equal to 0"),
    ({"min_tokens": 5, "max_tokens": 5}, "",
     "Value error, max_tokens (5) must be more than min_tokens (5)"),
    ({"near_duplicate_threshold": 0}, "near_duplicate_threshold",
     "Input should be greater than 0"),
    ({"near_duplicate_threshold": 1.01}, "near_duplicate_threshold",
     "Input should be less than or equal to 1"),
    ({"max_source_share": 0}, "max_source_share", "Input should be greater than 0"),
    ({"max_source_share": 1.5}, "max_source_share", "Input should be less than or equal to 1"),
    ({"min_sources": 0}, "min_sources", "Input should be greater than or equal to 1"),
    ({"eval_share": 1}, "eval_share", "Input should be less than 1"),
    ({"eval_share": -0.1}, "eval_share", "Input should be greater than or equal to 0")])
def test_config_bounds_are_refused_naming_the_field(kw: dict[str, float], where: str,
                                                    message: str) -> None:
    with pytest.raises(ValidationError) as e:
        ScorecardConfig(**kw)  # type: ignore[arg-type]
    assert [(".".join(map(str, err["loc"])), err["msg"]) for err in e.value.errors()] == [
        (where, message)]


def test_config_bounds_themselves_are_allowed() -> None:
    cfg = ScorecardConfig(floor=0, min_tokens=0, max_tokens=1, near_duplicate_threshold=1,
                          max_source_share=1, min_sources=1, eval_share=0)
    assert (cfg.floor, cfg.near_duplicate_threshold, cfg.eval_share) == (0, 1, 0)


def test_no_eval_share_puts_every_row_in_train(tmp_path: Path) -> None:
    (tmp_path / B).mkdir()
    (tmp_path / B / "a.jsonl").write_text("\n".join(sft(words(i), words(100 + i))
                                                    for i in range(50)) + "\n")
    _, clean = score_bucket(tmp_path, B, "sft", ScorecardConfig(floor=0, min_tokens=1,
                                                                eval_share=0))
    assert clean["split"].to_list() == ["train"] * 50


def test_the_card_carries_version_floor_and_config(tmp_path: Path) -> None:
    c = card(tmp_path, [sft(words(1), words(2))])
    cfg = ScorecardConfig(floor=7)
    out = scorecard_of([c], cfg, tmp_path)
    assert (out.version, out.floor, out.config["floor"]) == (1, 7, 7)
    assert out.buckets == [c] and out.corpus == str(tmp_path.resolve())


def test_sources_are_listed_by_clean_rows_then_name_with_rounded_shares(tmp_path: Path) -> None:
    lines = [sft(words(i), words(100 + i), source=s) for i, s in enumerate("zzyab")]
    c = card(tmp_path, lines + [sft("hi", "ok", source="a")], min_tokens=3)
    assert [(s.source, s.total, s.clean, s.share_of_clean) for s in c.sources] == [
        ("z", 2, 2, 0.4), ("a", 2, 1, 0.2), ("b", 1, 1, 0.2), ("y", 1, 1, 0.2)]
    thirds = card(tmp_path, lines[2:])
    assert [s.share_of_clean for s in thirds.sources] == [0.3333, 0.3333, 0.3333]
    assert (thirds.bucket, thirds.kind, thirds.path) == (B, "sft", str((tmp_path / B).resolve()))
    assert (thirds.total, thirds.clean, thirds.raw_lines) == (3, 3, 3)


def test_an_empty_bucket_has_no_shares_and_fails_the_floor(tmp_path: Path) -> None:
    (tmp_path / B).mkdir()
    c, clean = score_bucket(tmp_path, B, "dpo", ScorecardConfig(floor=1))
    assert (c.total, c.clean, c.sources, clean.height) == (0, 0, [], 0)
    assert c.reasons == ["0 clean pairs < floor 1", "0 distinct sources < minimum 1"]
    assert c.rules == dict.fromkeys(RULES, 0)


def test_only_readable_rows_are_flagged_for_pii(tmp_path: Path) -> None:
    c = card(tmp_path, [
        json.dumps({"prompt": "mail jane@example.com", "chosen": [1, 2], "rejected": "r"}),
        dpo("mail jane@example.com now", "fine answer", "other answer")],
        kind="dpo", pii_policy="flag")
    assert failures(c) == {"wrong_schema": 1} and c.pii_flagged == 1


def test_a_message_without_content_is_an_empty_turn(tmp_path: Path) -> None:
    c = card(tmp_path, [json.dumps({"prompt": [{"role": "user", "content": None}],
                                    "chosen": words(1), "rejected": words(2)})], kind="dpo")
    assert failures(c) == {"empty_turn": 1}


def test_curly_quotes_do_not_hide_an_exact_duplicate(tmp_path: Path) -> None:
    plain = sft(words(1), "He said 'yes' to it, and it's done")
    curly = sft(words(1), "He said \u201cyes\u201d to it, and it\u2019s done")
    c = card(tmp_path, [plain, curly])
    assert failures(c) == {"exact_duplicate": 1}


def test_a_bucket_with_no_clean_pair_gives_each_source_a_share_of_zero(tmp_path: Path) -> None:
    c = card(tmp_path, [sft("hi", "ok", "a"), sft("yo", "no", "b")], min_tokens=3)
    assert [(s.source, s.total, s.clean, s.share_of_clean) for s in c.sources] == [
        ("a", 1, 0, 0.0), ("b", 1, 0, 0.0)]
