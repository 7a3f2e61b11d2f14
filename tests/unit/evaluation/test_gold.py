"""The extraction eval's gold set (evals/extraction): the committed file is what its builder
makes from the copied sources, every gold name is grounded in its chunk, and one chunk's gold
matches what a person wrote down from reading it."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tasks.extraction.resolve import normalize
from tests.support.paths import ROOT

EVAL = ROOT / "evals" / "extraction"
GOLD = EVAL / "gold.jsonl"
ENTITY_TYPES = {"Person", "Organization", "Project", "Topic", "Decision", "Product", "Location",
                "Event"}
REL_TYPES = {"WORKS_FOR", "MEMBER_OF", "PARTICIPATED_IN", "DECIDED", "OWNS", "LOCATED_IN",
             "PART_OF", "RELATED_TO"}


def _load_builder() -> ModuleType:
    # evals/ is no package: load the script by path (registered first, for its dataclass)
    spec = importlib.util.spec_from_file_location("evals_build_gold", EVAL / "build_gold.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bg = _load_builder()
CASES = [json.loads(line) for line in GOLD.read_text(encoding="utf-8").splitlines()]
BY_ID = {c["id"]: c for c in CASES}


def _in(form: str, text: str) -> bool:
    return f" {normalize(form)} " in f" {normalize(text)} "


def test_committed_gold_is_what_the_builder_makes(tmp_path: Path) -> None:
    out = tmp_path / "gold.jsonl"
    bg.build(out)
    assert out.read_bytes() == GOLD.read_bytes(), \
        "gold.jsonl is stale: run .venv/bin/python evals/extraction/build_gold.py"


def test_the_builder_reads_only_the_repository() -> None:
    assert "shared" not in (EVAL / "build_gold.py").read_text(encoding="utf-8")
    assert bg.QMSUM == EVAL / "qmsum"


def test_ids_unique_and_sorted_by_split_then_id() -> None:
    ids = [c["id"] for c in CASES]
    assert len(set(ids)) == len(ids)
    assert [(c["split"], c["id"]) for c in CASES] == sorted((c["split"], c["id"]) for c in CASES)


def test_split_sizes_and_meetings() -> None:
    sizes = {s: sum(c["split"] == s for c in CASES) for s in ("train", "validation", "examples")}
    assert sizes == {"train": 20, "validation": 20, "examples": 6}
    meetings = {s: {c["id"].split("#")[0] for c in CASES if c["split"] == s}
                for s in ("train", "validation")}
    assert meetings["train"] == {"qmsum/covid_5", "qmsum/covid_7", "qmsum/education_12",
                                 "qmsum/education_15"}
    assert meetings["validation"] == {"qmsum/covid_2", "qmsum/covid_6", "qmsum/education_18",
                                      "qmsum/education_22"}
    # train meetings come from QMSum's train folder, validation from val
    for c in CASES:
        if c["source"] == "qmsum":
            folder = {"train": "train", "validation": "val"}[c["split"]]
            assert (EVAL / "qmsum" / folder / f"{c['id'][6:].split('#')[0]}.md").exists()


def test_the_licence_travels_with_the_copied_meetings() -> None:
    assert (EVAL / "qmsum" / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert "Yale-LILY" in (EVAL / "qmsum" / "LICENSE").read_text(encoding="utf-8")


def test_chunks_are_whole_turns_cut_from_the_copied_excerpts() -> None:
    for c in CASES:
        if c["source"] != "qmsum":
            continue
        meeting = c["id"][6:].split("#")[0]
        folder = "train" if c["split"] == "train" else "val"
        copied = (EVAL / "qmsum" / folder / f"{meeting}.md").read_text(encoding="utf-8")
        assert f"\n{c['text']}\n" in copied, c["id"]
        assert bg.CHUNK_MIN <= len(c["text"]) <= bg.CHUNK_MAX, c["id"]
        assert all(line.startswith("**") for line in c["text"].splitlines()), c["id"]
        assert c["stream"] == "transcripts" and c["title"] == f"Meeting {meeting}"


def test_every_gold_name_occurs_in_its_chunk() -> None:
    for c in CASES:
        for e in c["entities"]:
            forms = [e["name"], *e["aliases"]]
            where = f"{c['id']} {e['kind']} {e['name']}"
            if e["kind"] == "speaker":  # the label names them, and every alias is as written
                assert all(_in(f, c["text"]) for f in forms), where
            elif e["kind"] == "surname":  # only the title + surname form need occur
                assert e["aliases"] and all(_in(a, c["text"]) for a in e["aliases"]), where
                assert any(re.match(r"(Mr|Mrs|Ms|Miss|Dr|Minister)\b", a) for a in e["aliases"])
            elif e["kind"] in ("organization", "examples"):
                assert any(_in(f, c["text"]) for f in forms), where
            else:
                assert e["kind"] == "party", where


def test_relationships_name_entities_of_their_own_case() -> None:
    for c in CASES:
        ids = [e["id"] for e in c["entities"]]
        assert len(set(ids)) == len(ids), c["id"]
        assert {e["type"] for e in c["entities"]} <= ENTITY_TYPES
        for r in c["relationships"]:
            assert r["source"] in ids and r["target"] in ids, (c["id"], r)
            assert r["type"] in REL_TYPES


def test_party_gold_is_a_member_of_an_organisation_stated_in_a_label() -> None:
    for c in CASES:
        ents = {e["id"]: e for e in c["entities"]}
        for r in c["relationships"]:
            if r["kind"] != "party":
                continue
            person, party = ents[r["source"]], ents[r["target"]]
            assert r["type"] == "MEMBER_OF" and person["type"] == "Person"
            assert party["kind"] == "party" and party["type"] == "Organization"
            abbrev = party["aliases"][0]
            assert any(f", {abbrev})" in a for a in person["aliases"]), (c["id"], person)


def test_only_the_generated_briefings_are_complete() -> None:
    complete = sorted(c["id"] for c in CASES if c["complete"])
    assert complete == ["examples/anthony-rota.yaml", "examples/arnold-viersen.yaml",
                        "examples/bruce-stanton.yaml", "examples/lynne-neagle.yaml"]


def _gold_facts(case: dict) -> tuple[dict, set]:
    ents = {e["id"]: e for e in case["entities"]}
    entities = {(e["type"], e["name"], e["kind"]): sorted(e["aliases"]) for e in ents.values()}
    rels = {(ents[r["source"]]["name"], r["type"], ents[r["target"]]["name"])
            for r in case["relationships"]}
    return entities, rels


def test_a_hand_checked_chunk() -> None:
    """covid_7#1, read by hand: Garneau answers Barsalou-Duval (hurried along as
    "Mr.Barsalou-Duval", the source's missing space), the Chair's label names no one, and the
    Acting Chair, Bruce Stanton (Simcoe North, CPC), calls "Mr. Baker", who speaks next chunk."""
    case = BY_ID["qmsum/covid_7#1"]
    assert case["text"].startswith("**Hon. Marc Garneau:** Mr.Chair, as my hon.colleague knows")
    assert case["text"].endswith("Mr. Baker, go ahead.")
    entities, rels = _gold_facts(case)
    assert entities == {
        ("Person", "Marc Garneau", "speaker"): ["Hon. Marc Garneau"],
        ("Person", "Xavier Barsalou-Duval", "speaker"):
            ["Barsalou-Duval", "Mr. Xavier Barsalou-Duval", "Mr.Barsalou-Duval"],
        ("Person", "Bruce Stanton", "speaker"):
            ["The Acting Chair (Mr. Bruce Stanton (Simcoe North, CPC))"],
        ("Person", "Yvan Baker", "surname"): ["Baker", "Mr. Baker"],
        ("Organization", "Conservative Party of Canada", "party"):
            ["CPC", "Conservative Party", "Conservatives"],
        ("Organization", "Canadian Transportation Agency", "organization"): [],
        ("Organization", "Air Canada", "organization"): [],
        ("Organization", "Transport Canada", "organization"): [],
        ("Organization", "Government of Canada", "organization"): [],
    }
    assert rels == {("Bruce Stanton", "MEMBER_OF", "Conservative Party of Canada")}


def test_a_hand_checked_briefing() -> None:
    case = BY_ID["examples/lynne-neagle.yaml"]
    assert "Lynne Neagle took part in meeting education_1 of the Senedd Cymru" in case["text"]
    entities, rels = _gold_facts(case)
    assert set(entities) == {("Person", "Lynne Neagle", "examples"),
                             ("Organization", "Senedd Cymru", "examples"),
                             ("Event", "Meeting education_1", "examples")}
    assert rels == {("Lynne Neagle", "WORKS_FOR", "Senedd Cymru"),
                    ("Lynne Neagle", "PARTICIPATED_IN", "Meeting education_1"),
                    ("Meeting education_1", "PART_OF", "Senedd Cymru")}


@pytest.mark.parametrize(("label", "name", "party"), [
    ("Mr. Paul Manly (NanaimoLadysmith, GP)", "Paul Manly", "GP"),
    ("The Chair (Hon. Anthony Rota (NipissingTimiskaming, Lib.))", "Anthony Rota", "Lib."),
    ("Right Hon. Justin Trudeau (Prime Minister)", "Justin Trudeau", None),
    ("Hon. Carla Qualtrough (Minister of Employment, Workforce Development and Disability "
     "Inclusion)", "Carla Qualtrough", None),
    ("Mr. Kevin Vuong (Spadina-Fort York, Ind.)", "Kevin Vuong", None),
    ("Dr Frank Atherton", "Frank Atherton", None),
    ("Lynne Neagle AM", "Lynne Neagle", None),
])
def test_speaker_labels(label: str, name: str, party: str | None) -> None:
    r = bg.person(label)
    assert r is not None and r.name == name
    assert bg.party(r.affiliation) == party


@pytest.mark.parametrize("label", ["The Chair", "The Acting Chair", "The Deputy Speaker"])
def test_role_only_labels_name_no_one(label: str) -> None:
    assert bg.person(label) is None


def test_surnames_and_ambiguity() -> None:
    assert bg.surname("Tako Van Popta") == "Van Popta"
    assert bg.surname("Marie-Claude Bibeau") == "Bibeau"
    assert bg.surname("Harjit S. Sajjan") == "Sajjan"
    found = bg.unique_surnames(["Hon. Bill Blair", "Mr. Bruce Stanton",
                                "The Acting Chair (Mr. Bruce Stanton (Simcoe North, CPC))",
                                "Julie Morgan AM", "Eluned Morgan AM", "The Chair"])
    assert found == {"Blair": "Bill Blair", "Stanton": "Bruce Stanton"}  # two Morgans: none


def test_chunk_turns_cuts_at_whole_turns_within_bounds() -> None:
    turns = [f"**A{i}:** " + "x" * 390 for i in range(9)]  # 400 characters a turn
    chunks = bg.chunk_turns(turns, lo=1000, hi=1300)
    assert [c.count("\n") + 1 for c in chunks] == [3, 3, 3]
    assert "\n".join(chunks) == "\n".join(turns)
    assert bg.chunk_turns(turns[:2], lo=1000, hi=1300) == []  # a short tail is dropped
