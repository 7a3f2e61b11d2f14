"""A fourth document stream is one record in tasks/extraction/streams.py: added to a copy of the
registry here (a "notes" stream of *.txt files, its loader defined below, its folder in the
profile's [sources.other] table), phase 1 scans, extracts and reports it with no other module
changed — through the `extract` flow, against the fake endpoint and a real FalkorDB."""

import json
from pathlib import Path

import pytest

from flows.extract import extract
from tasks.extraction import streams
from tasks.extraction.loaders import Document
from tasks.graph.falkordb_store import FalkorDBStore
from tests.fakes.openai_server import FakeOpenAI
from tests.support.documents import transcript
from tests.support.profiles import extraction_profile

pytestmark = pytest.mark.usefixtures("prefect_api")


def load_note(text: str, path: Path) -> Document:
    """A note: its text, titled by its first line."""
    body = text.strip()
    return Document.read(body, {"title": body.splitlines()[0].rstrip(".")})


NOTES = streams.Stream("notes", ("*.txt",), load_note, "plain-text notes")


def test_a_fourth_stream_goes_through_phase_1(tmp_path: Path, falkordb: int, fake_llm: FakeOpenAI,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "STREAMS", (*streams.STREAMS, NOTES))
    src = tmp_path / "docs"
    profile = extraction_profile(tmp_path, base_url=fake_llm.url, falkordb_port=falkordb,
                                 graph="f_fourth_stream", sources=src)
    with profile.open("a") as f:  # the stream's folder: no block field of its own
        f.write(f"[sources.other]\nnotes = {json.dumps(str(src / 'notes'))}\n")
    (src / "transcripts" / "m.md").write_text(transcript(["Ann Lee", "Bob Stone"]))
    (src / "notes" / "deep").mkdir(parents=True)
    (src / "notes" / "a.txt").write_text("Expo day.\nAnn Lee met Cy Young at the expo.\n")
    (src / "notes" / "deep" / "b.txt").write_text("Dee Ray wrote to Ann Lee.\n")
    (src / "notes" / "ignored.md").write_text("# Not a note\n\nEve Park.\n")  # not *.txt
    store = FalkorDBStore("127.0.0.1", falkordb, "f_fourth_stream")
    try:
        fake_llm.reset()
        s = extract(profile=str(profile)).model_dump(mode="json")
        zero = {"seen": 0, "extracted": 0, "skipped": 0, "failed": 0}
        assert s["documents"] == {
            "transcripts": {"seen": 1, "extracted": 1, "skipped": 0, "failed": 0},
            "research": zero, "contacts": zero,
            "notes": {"seen": 2, "extracted": 2, "skipped": 0, "failed": 0}}
        assert s["llm_calls"] == fake_llm.calls == 3
        # what the model read of each note: its loader's text, titled by its metadata
        asked = sorted(r["messages"][-1]["content"] for r in fake_llm.requests
                       if "(notes)" in r["messages"][-1]["content"])
        assert asked == ["Document: Dee Ray wrote to Ann Lee (notes)\n---\n"
                         "Dee Ray wrote to Ann Lee.",
                         "Document: Expo day (notes)\n---\nExpo day.\n"
                         "Ann Lee met Cy Young at the expo."]
        docs = store.query("MATCH (d:Document) RETURN d.id AS id, d.stream AS s ORDER BY id")
        assert docs == [{"id": "notes/a.txt", "s": "notes"},
                        {"id": "notes/deep/b.txt", "s": "notes"},
                        {"id": "transcripts/m.md", "s": "transcripts"}]
        ann = store.query("MATCH (:Person {key: 'Person:ann lee'})-[:MENTIONED_IN]->(d:Document) "
                          "RETURN d.id AS id ORDER BY id")
        assert [r["id"] for r in ann] == ["notes/a.txt", "notes/deep/b.txt", "transcripts/m.md"]
        cy = store.query("MATCH (:Person {key: 'Person:cy young'})-[:MENTIONED_IN]->(d:Document) "
                         "RETURN d.id AS id")
        assert cy == [{"id": "notes/a.txt"}]

        # unchanged: the notes are skipped like any stream's documents
        fake_llm.reset()
        s = extract(profile=str(profile)).model_dump(mode="json")
        assert fake_llm.calls == 0
        assert s["documents"]["notes"] == {"seen": 2, "extracted": 0, "skipped": 2, "failed": 0}
    finally:
        try:
            store._graph.delete()
        except Exception:  # noqa: BLE001
            pass
