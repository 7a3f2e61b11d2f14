"""The eval's metrics, gate and gold loader on hand-built predictions, with figures computed by
hand (tasks/evaluation/metrics.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.evaluation.gate import check_comparable, compare
from tasks.evaluation.gold import GoldCase, load_gold
from tasks.evaluation.metrics import (
    CasePrediction,
    PredictedEntity,
    f1,
    score,
    score_case,
)
from tasks.extraction.resolve import resolve
from tasks.shared.errors import ConfigError
from tests.support.paths import FIXTURES

GOLD = FIXTURES / "eval-gold.jsonl"


def _ent(type_: str, *names: str) -> PredictedEntity:
    key, r = resolve(type_, names[0])
    return PredictedEntity(key, type_, (r.name, *names))


def _key(type_: str, name: str) -> str:
    return resolve(type_, name)[0]


def _perfect(case: GoldCase) -> CasePrediction:
    ents = {g.id: _ent(g.type, g.name) for g in case.entities}
    return CasePrediction(case.id, list(ents.values()),
                          [(ents[r.source].key, r.type, ents[r.target].key)
                           for r in case.relationships], grounded=len(ents))


def _noise(case: GoldCase) -> CasePrediction:
    """What tests/fakes/eval_server.py's noise mode answers, as the pipeline resolves it."""
    first = case.entities[0]
    wrong = "Topic" if first.type == "Location" else "Location"
    return CasePrediction(case.id, [_ent("Topic", "Zorblax Quintane"), _ent(wrong, first.name)],
                          [(_key("Topic", "Zorblax Quintane"), "RELATED_TO",
                            _key(wrong, first.name))], grounded=2, ungrounded=2)


def test_the_fixture_loads_by_split() -> None:
    cases, digest = load_gold(GOLD, "all")
    assert [c.split for c in cases] == ["validation", "validation", "train", "examples"]
    assert len(digest) == 16
    assert [c.id for c in load_gold(GOLD, "validation")[0]] == ["fixture/committee#0",
                                                                "fixture/senedd#3"]


def test_perfect_predictions_score_one() -> None:
    cases, _ = load_gold(GOLD, "all")
    overall, splits, _ = score(cases, {c.id: _perfect(c) for c in cases})
    for f in (overall["entities"]["type_agnostic"], overall["entities"]["type_strict"],
              overall["relationships"]):
        assert (f["precision"], f["recall"], f["f1"]) == (1.0, 1.0, 1.0)
    # precision rests on the 3 complete cases (8 entities, 5 triples), recall on all 4
    assert overall["entities"]["type_strict"]["predictions"] == 8
    assert overall["entities"]["type_strict"]["gold"] == 10
    assert overall["relationships"]["predictions"] == 5
    assert overall["entities"]["type_strict"]["precision_cases"] == 3
    assert overall["entities"]["type_strict"]["recall_cases"] == 4
    assert overall["grounded"]["precision"] == 1.0
    assert overall["resolution"]["over_split"] == overall["resolution"]["over_merge"] == 0
    assert set(splits) == {"train", "validation", "examples"}


def test_noise_scores_the_hand_computed_figures() -> None:
    cases, _ = load_gold(GOLD, "all")
    overall, splits, _ = score(cases, {c.id: _noise(c) for c in cases})
    agn = overall["entities"]["type_agnostic"]
    # complete cases 3 × 2 predictions = 6, of which the real name is right by name: 3 → P 0.5;
    # gold 10 entities (3+2+3+2), one found a case → R 4/10; F1 2·0.5·0.4/0.9 = 4/9
    assert (agn["correct"], agn["predictions"], agn["found"], agn["gold"]) == (3, 6, 4, 10)
    assert agn["precision"] == 0.5 and agn["recall"] == 0.4
    assert agn["f1"] == pytest.approx(4 / 9, abs=1e-12)
    strict = overall["entities"]["type_strict"]  # every type is wrong: 0/6, 0/10
    assert (strict["precision"], strict["recall"], strict["f1"]) == (0.0, 0.0, 0.0)
    rel = overall["relationships"]  # 0 of 3 triples right; 0 of 5 gold found
    assert (rel["predictions"], rel["gold"], rel["precision"], rel["recall"], rel["f1"]) == \
        (3, 5, 0.0, 0.0, 0.0)
    assert overall["grounded"] == {"precision": 0.5, "grounded": 8, "ungrounded": 8}
    # split validation: 1 complete case (2 predictions, 1 right), gold 3 + 2, 2 found
    v = splits["validation"]["entities"]["type_agnostic"]
    assert (v["precision"], v["recall"]) == (0.5, 0.4)


def test_a_recall_only_case_has_no_precision() -> None:
    cases, _ = load_gold(GOLD, "validation")
    senedd = [c for c in cases if not c.complete]
    overall, _, _ = score(senedd, {c.id: _perfect(c) for c in senedd})
    f = overall["entities"]["type_strict"]
    assert (f["precision"], f["recall"], f["f1"]) == (None, 1.0, None)
    assert f["precision_cases"] == 0
    # no gold triple there: recall has nothing to rest on either
    assert overall["relationships"]["recall"] is None
    assert overall["relationships"]["f1"] is None


def test_a_failed_case_counts_against_recall() -> None:
    cases, _ = load_gold(GOLD, "examples")
    overall, _, scores = score(cases, {cases[0].id: CasePrediction(
        cases[0].id, error="gave up after 3 attempts", error_type="LLMError")})
    f = overall["entities"]["type_strict"]
    assert (f["precision"], f["recall"], f["f1"]) == (None, 0.0, 0.0)
    assert overall["failed_cases"] == 1 and scores[0].error_type == "LLMError"


def _case(**kw: object) -> GoldCase:
    base = {"id": "t#0", "split": "train", "complete": True, "text": "x", "relationships": []}
    return GoldCase.model_validate({**base, **kw})


def test_over_split_and_over_merge() -> None:
    case = _case(entities=[
        {"id": "e1", "type": "Person", "name": "Paul Manly", "aliases": ["Mr. Manly"]},
        {"id": "e2", "type": "Person", "name": "Elizabeth May", "aliases": ["Ms. May"]},
        {"id": "e3", "type": "Person", "name": "Theresa May", "aliases": ["Mrs. May"]}])
    # "Paul Manly" and "Mr. Manly" stayed two keys (split); "May" matches both Mays (merged)
    preds = CasePrediction("t#0", [_ent("Person", "Paul Manly"), _ent("Person", "Mr. Manly"),
                                   _ent("Person", "May")])
    s = score_case(case, preds)
    assert s.counts["over_split"] == 1 and s.counts["matched_gold"] == 3
    assert s.counts["over_merge"] == 1 and s.counts["matched_keys"] == 3
    overall, _, _ = score([case], {"t#0": preds})
    assert overall["resolution"] == {"over_split": 1, "over_split_rate": 1 / 3,
                                     "matched_gold": 3, "over_merge": 1,
                                     "over_merge_rate": 1 / 3, "matched_keys": 3}
    # all 3 predictions match some gold entity; all 3 gold entities are found
    assert overall["entities"]["type_strict"]["precision"] == 1.0
    assert overall["entities"]["type_strict"]["recall"] == 1.0


def test_a_triple_counts_in_its_direction_only() -> None:
    case = _case(entities=[{"id": "a", "type": "Person", "name": "Priya Raman"},
                           {"id": "b", "type": "Organization", "name": "Northwind Rail"}],
                 relationships=[{"source": "a", "type": "WORKS_FOR", "target": "b"}])
    a, b = _key("Person", "Priya Raman"), _key("Organization", "Northwind Rail")
    ents = [_ent("Person", "Priya Raman"), _ent("Organization", "Northwind Rail")]
    back = score_case(case, CasePrediction("t#0", ents, [(b, "WORKS_FOR", a)]))
    assert back.counts["relationship_correct"] == 0 and back.counts["relationship_found"] == 0
    other = score_case(case, CasePrediction("t#0", ents, [(a, "MEMBER_OF", b)]))
    assert other.counts["relationship_correct"] == 0
    right = score_case(case, CasePrediction("t#0", ents, [(a, "WORKS_FOR", b)]))
    assert right.counts["relationship_correct"] == right.counts["relationship_found"] == 1


def test_names_match_through_the_resolver_normalisation() -> None:
    case = _case(entities=[{"id": "e1", "type": "Person", "name": "Élise Côté"}])
    s = score_case(case, CasePrediction("t#0", [_ent("Person", "Hon. ELISE  cote")]))
    assert s.counts["entity_correct_strict"] == 1


def test_f1_rules() -> None:
    assert f1(0.5, 0.4) == pytest.approx(4 / 9)
    assert f1(None, 0.0) == 0.0 and f1(0.0, None) == 0.0
    assert f1(None, 0.5) is None and f1(None, None) is None


def _result(model: str = "m", split: str = "validation", ef1: float | None = 0.5,
            rf1: float | None = 0.3, gp: float | None = 0.9, er: float | None = 0.6
            ) -> dict[str, object]:
    return {"model": model, "split": split, "figures": {
        "entities": {"type_strict": {"f1": ef1, "recall": er}},
        "relationships": {"f1": rf1, "recall": None}, "grounded": {"precision": gp}}}


def test_the_gate_allows_the_tolerance_and_no_more() -> None:
    base = _result()
    assert all(r["passed"] for r in compare(base, _result(ef1=0.48, rf1=0.9), 0.02))
    rows = compare(base, _result(ef1=0.47, gp=None, er=0.7), 0.02)
    assert [(r["figure"], r["passed"]) for r in rows] == [
        ("entity F1 (type-strict)", False), ("entity recall (type-strict)", True),
        ("relationship F1", True), ("relationship recall", True),
        ("grounded precision", False)]
    assert rows[0]["old"] == 0.5 and rows[0]["new"] == 0.47
    # a baseline figure that is null holds nothing back
    assert all(r["passed"] for r in compare(_result(rf1=None), _result(rf1=0.0), 0.02))


def test_the_gate_refuses_another_model_or_split() -> None:
    with pytest.raises(ConfigError, match="model 'other'"):
        check_comparable(_result(model="other"), _result(), Path("b.json"))
    with pytest.raises(ConfigError, match="split 'train'"):
        check_comparable(_result(split="train"), _result(), Path("b.json"))
    check_comparable(_result(), _result(), Path("b.json"))


def test_bad_gold_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "g.jsonl"
    bad.write_text(json.dumps({"id": "x", "split": "train", "text": "t", "entities": [],
                               "relationships": [{"source": "e1", "type": "R",
                                                  "target": "e2"}]}) + "\n")
    with pytest.raises(ConfigError, match="line 1"):
        load_gold(bad)
    with pytest.raises(ConfigError, match="no case in split 'examples'"):
        load_gold(_only_train(tmp_path), "examples")
    with pytest.raises(ConfigError, match="not found"):
        load_gold(tmp_path / "missing.jsonl")


def _only_train(tmp: Path) -> Path:
    p = tmp / "train.jsonl"
    p.write_text(json.dumps({"id": "x", "split": "train", "text": "t"}) + "\n")
    return p


def test_a_partial_answer_lists_what_it_missed_and_got_wrong_and_recall_by_kind() -> None:
    (case,) = [c for c in load_gold(GOLD, "validation")[0] if c.id == "fixture/committee#0"]
    manly, gp = _ent("Person", "Mr. Manly"), _ent("Organization", "GP")  # by their aliases
    may = _ent("Topic", "Elizabeth May")  # the right name, the wrong type
    nameless = PredictedEntity("Topic:x", "Topic", ())
    pred = CasePrediction(case.id, [manly, gp, may, nameless],
                          [(manly.key, "MEMBER_OF", gp.key), (manly.key, "WORKS_FOR", gp.key)],
                          grounded=3, ungrounded=1)
    s = score_case(case, pred)
    assert (s.case_id, s.split, s.complete, s.error, s.error_type) == (
        "fixture/committee#0", "validation", True, None, None)
    assert s.missed == ["Person Elizabeth May", "Elizabeth May MEMBER_OF Green Party"]
    assert s.wrong == ["Topic Elizabeth May", "Topic Topic:x",
                       f"{manly.key} WORKS_FOR {gp.key}"]
    assert s.gold_kinds == {"entity:speaker": 2, "found:entity:speaker": 1, "entity:party": 1,
                            "found:entity:party": 1, "relationship:party": 2,
                            "found:relationship:party": 1}
    overall, _, _ = score([case], {case.id: pred})
    assert overall["recall_by_kind"] == {
        "entity:party": {"gold": 1, "found": 1, "recall": 1.0},
        "entity:speaker": {"gold": 2, "found": 1, "recall": 0.5},
        "relationship:party": {"gold": 2, "found": 1, "recall": 0.5}}
    assert (overall["cases"], overall["complete_cases"], overall["failed_cases"]) == (1, 1, 0)
    assert overall["resolution"] == {"over_split": 0, "over_split_rate": 0.0, "matched_gold": 3,
                                     "over_merge": 0, "over_merge_rate": 0.0, "matched_keys": 3}
    # 4 predictions: 3 right by name, 2 by type too; 1 of the 2 triples right
    strict = overall["entities"]["type_strict"]
    assert (strict["correct"], strict["predictions"], strict["found"], strict["gold"]) == \
        (2, 4, 2, 3)
    rel = overall["relationships"]
    assert (rel["correct"], rel["predictions"], rel["found"], rel["gold"]) == (1, 2, 1, 2)


def _priya_works_for_northwind(complete: bool = True) -> GoldCase:
    return _case(complete=complete,
                 entities=[{"id": "a", "type": "Person", "name": "Priya Raman"},
                           {"id": "b", "type": "Organization", "name": "Northwind Rail"}],
                 relationships=[{"source": "a", "type": "WORKS_FOR", "target": "b"}])


def test_a_triple_naming_a_key_no_entity_has_is_wrong_not_an_error() -> None:
    a, b = _key("Person", "Priya Raman"), _key("Organization", "Northwind Rail")
    ents = [_ent("Person", "Priya Raman"), _ent("Organization", "Northwind Rail")]
    s = score_case(_priya_works_for_northwind(), CasePrediction(
        "t#0", ents, [("Person:ghost", "WORKS_FOR", b), (a, "WORKS_FOR", "Organization:ghost")]))
    assert (s.counts["relationship_predictions"], s.counts["relationship_correct"],
            s.counts["relationship_found"]) == (2, 0, 0)
    assert s.wrong == [f"Person:ghost WORKS_FOR {b}", f"{a} WORKS_FOR Organization:ghost"]
    assert s.missed == ["Priya Raman WORKS_FOR Northwind Rail"]


def test_a_recall_only_case_calls_nothing_wrong() -> None:
    s = score_case(_priya_works_for_northwind(complete=False),
                   CasePrediction("t#0", [_ent("Topic", "Zorblax Quintane")]))
    assert s.wrong == []
    assert s.counts["entity_predictions"] == 0 and s.counts["precision_cases"] == 0


def test_a_wrong_entity_is_named_by_its_first_written_name() -> None:
    odd = PredictedEntity("Topic:zorblax", "Topic", ("Zorblax Quintane", "the Zorblax"))
    s = score_case(_priya_works_for_northwind(), CasePrediction("t#0", [odd]))
    assert s.wrong == ["Topic Zorblax Quintane"]


def test_recall_by_kind_counts_every_item_found() -> None:
    case = _case(entities=[
        {"id": "e1", "type": "Person", "name": "Paul Manly", "kind": "speaker"},
        {"id": "e2", "type": "Person", "name": "Elizabeth May", "kind": "speaker"},
        {"id": "e3", "type": "Organization", "name": "Green Party"}],
        relationships=[{"source": "e1", "type": "MEMBER_OF", "target": "e3", "kind": "party"},
                       {"source": "e2", "type": "MEMBER_OF", "target": "e3", "kind": "party"}])
    s = score_case(case, _perfect(case))
    assert s.gold_kinds == {"entity:speaker": 2, "found:entity:speaker": 2,
                            "entity:Organization": 1, "found:entity:Organization": 1,
                            "relationship:party": 2, "found:relationship:party": 2}
    assert s.missed == []


def test_a_failed_case_keeps_its_error_message() -> None:
    s = score_case(_priya_works_for_northwind(), CasePrediction(
        "t#0", error="gave up after 3 attempts", error_type="LLMError"))
    assert (s.error, s.error_type) == ("gave up after 3 attempts", "LLMError")
    assert s.counts["failed"] == 1


def test_a_case_with_no_prediction_fails_as_missing() -> None:
    answered = _priya_works_for_northwind()
    unanswered = _case(id="t#1", entities=[{"id": "a", "type": "Person", "name": "Ann Lee"}])
    overall, _, scores = score([answered, unanswered], {"t#0": _perfect(answered)})
    assert [(s.case_id, s.error, s.error_type) for s in scores] == [
        ("t#0", None, None), ("t#1", "no answer", "Missing")]
    assert overall["failed_cases"] == 1
    assert overall["entities"]["type_strict"]["recall"] == pytest.approx(2 / 3)


def test_each_split_is_scored_on_its_own_cases_only() -> None:
    train = _priya_works_for_northwind()
    valid = _case(id="v#0", split="validation",
                  entities=[{"id": "a", "type": "Person", "name": "Ann Lee"}])
    overall, splits, _ = score([train, valid], {"t#0": _perfect(train)})
    assert sorted(splits) == ["train", "validation"]
    assert (splits["train"]["cases"], splits["train"]["failed_cases"]) == (1, 0)
    assert splits["train"]["entities"]["type_strict"]["recall"] == 1.0
    assert (splits["validation"]["cases"], splits["validation"]["failed_cases"]) == (1, 1)
    assert splits["validation"]["entities"]["type_strict"]["recall"] == 0.0
    assert overall["cases"] == 2 and overall["failed_cases"] == 1
