import json
from pathlib import Path

import pytest

from tasks.extraction.documents import Document, LoadFailure, load_document, scan

MB = 1_000_000


def load(tmp_path: Path, stream: str, name: str, data: bytes | str) -> Document | LoadFailure:
    root = tmp_path / stream
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return load_document(stream, root, path, 2 * MB)


def test_transcript_front_matter_and_stable_id(tmp_path: Path) -> None:
    text = ("---\nmeeting_id: ES1\nparticipants:\n  - \"Hon. A B (Minister)\"\n  - \"Grad A\"\n"
            "date: 2020-05-01\n---\n\n# Meeting ES1\n\n**Grad A:** Hello.\n")
    d = load(tmp_path, "transcripts", "sub/ES1.md", text)
    assert isinstance(d, Document)
    assert d.id == "transcripts/sub/ES1.md"
    assert d.metadata == {"title": "Meeting ES1", "date": "2020-05-01",
                          "participants": ["Hon. A B (Minister)", "Grad A"], "meeting_id": "ES1"}
    assert d.text.startswith("# Meeting ES1") and "meeting_id" not in d.text
    d2 = load(tmp_path, "transcripts", "sub/ES1.md", text)
    assert d2.hash == d.hash


def test_research_yaml_records_and_markdown_notes(tmp_path: Path) -> None:
    d = load(tmp_path, "research", "r.yaml", "- title: One\n  findings: [a]\n- title: Two\n")
    assert isinstance(d, Document) and d.metadata == {"title": "One", "records": 2}
    assert "Two" in d.text
    n = load(tmp_path, "research", "n.md", "# Note\n\nAcme builds remotes.\n")
    assert isinstance(n, Document) and "Acme" in n.text


def test_contacts_one_record_or_a_list(tmp_path: Path) -> None:
    one = load(tmp_path, "contacts", "a.json",
               json.dumps({"name": "Ann Lee", "emails": "ANN@x.org", "notes": "Met at expo."}))
    assert isinstance(one, Document)
    assert one.records[0]["emails"] == ["ann@x.org"]
    assert one.text == "Notes on Ann Lee: Met at expo."
    many = load(tmp_path, "contacts", "b.json", json.dumps([{"name": "A"}, {"name": "B"}]))
    assert isinstance(many, Document) and len(many.records) == 2 and many.text == ""


def test_a_bad_record_costs_only_itself(tmp_path: Path) -> None:
    people = [{"name": "Ann Lee", "notes": "Met at expo."}, {"name": ""},
              {"name": "Bob Stone", "emails": ["nope"]}, 5, {"name": "Cy Young"}]
    d = load(tmp_path, "contacts", "x.json", json.dumps(people))
    assert isinstance(d, Document), d
    assert [r["name"] for r in d.records] == ["Ann Lee", "Cy Young"]
    assert d.metadata == {"records": 2}
    assert d.text == "Notes on Ann Lee: Met at expo."
    assert [b["record"] for b in d.bad_records] == [1, 2, 3]
    assert "record 1: field 'name': String should have at least 1 character" in \
        d.bad_records[0]["reason"]
    assert "not an e-mail address: 'nope'" in d.bad_records[1]["reason"]
    assert "record 3: expected a JSON object" in d.bad_records[2]["reason"]

    r = load(tmp_path, "research", "r.yaml", "- title: One\n- just text\n- title: Two\n")
    assert isinstance(r, Document), r
    assert r.metadata == {"title": "One", "records": 2}
    assert "just text" not in r.text and "Two" in r.text
    assert r.bad_records == [{"record": 1, "reason": "record 1: expected a mapping (key: value "
                                                    "lines), got a string"}]


def test_a_file_whose_every_record_is_bad_fails_with_every_reason(tmp_path: Path) -> None:
    f = load(tmp_path, "contacts", "x.json", json.dumps([{"name": ""}, 7]))
    assert isinstance(f, LoadFailure)
    assert f.reason.startswith("every record is bad: record 0: field 'name'")
    assert "record 1: expected a JSON object" in f.reason


ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n" \
             "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"


@pytest.mark.parametrize(("stream", "name", "data", "reason"), [
    ("transcripts", "empty.md", "", "empty file"),
    ("transcripts", "blank.md", "  \n\n", "empty file"),
    ("transcripts", "bin.md", b"\x89PNG\r\n\x1a\n\x00\x00\x00", "binary file"),
    ("transcripts", "latin1.md", "caf\xe9 au lait".encode("latin-1"), "not valid UTF-8 at byte 3"),
    ("transcripts", "open.md", "---\ntitle: x\nno closing\n", "never closed"),
    ("transcripts", "badfm.md", "---\ntitle: [unclosed\n---\nbody\n", "malformed YAML"),
    ("transcripts", "onlyfm.md", "---\ntitle: x\n---\n", "no text after the front matter"),
    ("research", "bomb.yaml", ALIAS_BOMB, "YAML aliases are not allowed"),
    ("research", "scalar.yaml", "just a string\n", "expected a YAML mapping"),
    ("research", "bad.yml", "key: [1, 2\n", "malformed YAML"),
    ("contacts", "bad.json", '{"name": "A",', "malformed JSON at line 1"),
    ("contacts", "noname.json", '[{"emails": ["a@b.co"]}, {"name": ""}]', "record 1: field 'name'"),
    ("research", "nomapping.yaml", "- one\n- 2\n", "record 1: expected a mapping"),
    ("contacts", "bademail.json", '{"name": "A", "emails": ["nope"]}', "not an e-mail address"),
    ("contacts", "scalar.json", "[1]", "record 0: expected a JSON object"),
    ("contacts", "emptylist.json", "[]", "empty contact list"),
])
def test_bad_inputs_become_failures_with_reasons(tmp_path: Path, stream: str, name: str,
                                                 data: bytes | str, reason: str) -> None:
    f = load(tmp_path, stream, name, data)
    assert isinstance(f, LoadFailure), f
    assert reason in f.reason
    assert f.id == f"{stream}/{name}"


def test_ten_megabyte_transcript_is_refused_with_the_fix(tmp_path: Path) -> None:
    f = load(tmp_path, "transcripts", "huge.md", "**A:** " + "blah " * 2_000_000)
    assert isinstance(f, LoadFailure)
    assert "too large (10.0 MB > 2.0 MB limit)" in f.reason and "max_document_mb" in f.reason


def test_scan_counts_everything_and_ignores_hidden_and_other_files(tmp_path: Path) -> None:
    t = tmp_path / "t"
    t.mkdir()
    (t / "a.md").write_text("hello")
    (t / "b.md").write_text("")
    (t / ".hidden.md").write_text("x")
    (t / "LICENSE").write_text("MIT")
    docs, failures = scan({"transcripts": t}, MB)
    assert [d.id for d in docs] == ["transcripts/a.md"]
    assert [f.id for f in failures] == ["transcripts/b.md"]
