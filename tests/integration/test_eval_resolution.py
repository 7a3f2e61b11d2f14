"""`slm-nightly eval resolution` end to end: the gold sets through phase 1's resolution on a
real embedded FalkorDB (tasks/evaluation/resolution.py), and a gold set whose truth two
records break (one address, two people) scored as the figures worked out by hand say."""

import json
from pathlib import Path

import pytest

from flows.cli import main
from tasks.evaluation.resolution import GOLD


def test_both_gold_sets_pass_the_gate_with_no_namesake_merged(
        capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("dev", "heldout"):
        assert main(["eval", "resolution", "--gold", str(GOLD / name), "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["gate"] == "passed"
        assert result["people"]["namesakes_merged"] == 0
        # every planted organization variant joined; no two organizations joined
        orgs = result["organizations"]
        assert orgs["entities"] == orgs["identities"] == 8
        assert orgs["pairwise_precision"] == orgs["pairwise_recall"] == 1.0


def test_a_merge_against_the_truth_is_scored_and_fails_the_gate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two people who share one address (p1 and p2) must become one Person: pairwise
    precision 0/1, B-cubed precision (1/2 + 1/2 + 1) / 3, one entity holding namesakes."""
    (tmp_path / "contacts").mkdir()
    (tmp_path / "contacts" / "c.json").write_text(json.dumps([
        {"name": "Ann Lee", "emails": ["a@x.example"], "organization": "Acme Ltd"},
        {"name": "Ann Lee", "emails": ["a@x.example"], "organization": "Acme Limited"},
        {"name": "Bob Ray", "emails": ["b@x.example"], "organization": "Acme"}]))
    (tmp_path / "truth.json").write_text(json.dumps({
        "people": {"contacts/c.json#0": "p1", "contacts/c.json#1": "p2",
                   "contacts/c.json#2": "p3"},
        "organizations": {f"contacts/c.json#{i}": "o1" for i in range(3)}}))
    assert main(["eval", "resolution", "--gold", str(tmp_path), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["people"] == {
        "mentions": 3, "identities": 3, "entities": 2, "pairwise_precision": 0.0,
        "pairwise_recall": 1.0, "bcubed_precision": 0.6667, "bcubed_recall": 1.0,
        "namesakes_merged": 1}
    assert result["organizations"]["entities"] == 1
    assert result["gate"] == ["people pairwise_precision 0.000 < 0.98",
                              "people bcubed_precision 0.667 < 0.98",
                              "1 entities hold namesakes"]


def test_a_folder_without_truth_is_refused_naming_the_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "resolution", "--gold", str(tmp_path)]) == 2
    assert (f"eval resolution: {tmp_path}/truth.json is missing — give a gold set folder"
            in capsys.readouterr().err)


def test_a_record_with_a_phone_alone_is_scored_by_the_person_holding_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two Ann Lees with their own addresses and phones, then a record of the first one's
    phone alone (written another way): three mentions of two people, all as the truth says."""
    (tmp_path / "contacts").mkdir()
    (tmp_path / "contacts" / "c.json").write_text(json.dumps([
        {"name": "Ann Lee", "emails": ["a@x.example"], "phones": ["+1 555 100 2000"]},
        {"name": "Ann Lee", "emails": ["b@y.example"], "phones": ["+44 20 7946 0958"]},
        {"name": "Ann Lee", "phones": ["(555) 100-2000"]}]))
    (tmp_path / "truth.json").write_text(json.dumps({
        "people": {"contacts/c.json#0": "p1", "contacts/c.json#1": "p2",
                   "contacts/c.json#2": "p1"}, "organizations": {}}))
    assert main(["eval", "resolution", "--gold", str(tmp_path), "--json"]) == 0
    people = json.loads(capsys.readouterr().out)["people"]
    assert (people["mentions"], people["identities"], people["entities"]) == (3, 2, 2)
    assert people["pairwise_precision"] == people["pairwise_recall"] == 1.0


def test_a_record_with_an_initial_and_an_employer_alone_is_scored_by_its_spelling(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Priya and Paul Raman, both at Contoso; "P. Raman" at Contoso could be either (no join:
    an entity of its own), "Q. Lee" at Contoso is Quinn Lee: four mentions of three people."""
    (tmp_path / "contacts").mkdir()
    (tmp_path / "contacts" / "c.json").write_text(json.dumps([
        {"name": "Priya Raman", "emails": ["p@c.example"], "organization": "Contoso"},
        {"name": "Paul Raman", "emails": ["pr@c.example"], "organization": "Contoso Ltd"},
        {"name": "Quinn Lee", "emails": ["q@c.example"], "organization": "Contoso"},
        {"name": "P. Raman", "organization": "Contoso Limited"},
        {"name": "Q. Lee", "organization": "Contoso Limited"}]))
    (tmp_path / "truth.json").write_text(json.dumps({
        "people": {"contacts/c.json#0": "p1", "contacts/c.json#1": "p2",
                   "contacts/c.json#2": "p3", "contacts/c.json#3": "p1",
                   "contacts/c.json#4": "p3"},
        "organizations": {f"contacts/c.json#{i}": "o1" for i in range(5)}}))
    assert main(["eval", "resolution", "--gold", str(tmp_path), "--json"]) == 1
    people = json.loads(capsys.readouterr().out)["people"]
    assert (people["mentions"], people["identities"], people["entities"]) == (5, 3, 4)
    # pairs: (0,3) and (2,4) are true; only (2,4) was made
    assert (people["pairwise_precision"], people["pairwise_recall"]) == (1.0, 0.5)
