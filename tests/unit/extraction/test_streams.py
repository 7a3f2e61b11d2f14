"""The stream registry (tasks/extraction/streams.py) and what reads it: every stream's folder has
a place on the DocumentSources block, a block saved before the registry still loads, and a stream
added to the registry is scanned, loaded, rooted and named in messages with no other change."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from blocks.sources import DocumentSources
from tasks.extraction import streams
from tasks.extraction.answers import BatchReport, build_batch
from tasks.extraction.calls import DocOutcome
from tasks.extraction.documents import Document, LoadFailure, load_document, scan
from tasks.extraction.inputs import source_roots
from tasks.extraction.rows import DocRows, entity
from tasks.extraction.streams import STREAMS, Stream, by_name
from tasks.graph.ontology import GraphSchema
from tasks.profile import load_profile
from tasks.shared.errors import ConfigError
from tasks.shared.files import sha256_hex
from tests.support.paths import ROOT

MB = 1_000_000


def notes_loader(text: str, path: Path) -> Document:
    return Document.read(text.strip(), {"title": path.stem})


def notes_rows(doc: Document, rows: DocRows, email_keys: dict[str, str],
               ontology: GraphSchema, pruned: Counter[str]) -> None:
    rows.add(entity("Topic", doc.metadata["title"]))


NOTES = Stream("notes", ("*.txt",), notes_loader, "plain notes", rows=notes_rows)


@pytest.fixture
def with_notes(monkeypatch: pytest.MonkeyPatch) -> Stream:
    """The registry with a fourth stream, read from `other` (no block field of its own)."""
    monkeypatch.setattr(streams, "STREAMS", (*STREAMS, NOTES))
    return NOTES


def test_the_shipped_streams_in_scan_order() -> None:
    assert [(s.name, s.patterns, s.source_field, s.rows is not None) for s in STREAMS] == [
        ("transcripts", ("*.md",), "transcripts", True),
        ("research", ("*.yaml", "*.yml", "*.md"), "research", False),
        ("contacts", ("*.json",), "contacts", True)]
    assert by_name("research") is STREAMS[1]
    with pytest.raises(ValueError, match="no document stream 'notes': the streams are "
                                         "transcripts, research, contacts"):
        by_name("notes")
    assert streams.settings_text() == "transcripts, research or contacts"


def test_every_stream_has_its_folder_on_the_block() -> None:
    """A stream's `source_field` is a DocumentSources field (a string, optional, described as
    the stream and its patterns); a stream without one is read from `other`, which is there."""
    fields = DocumentSources.model_fields
    assert "other" in fields and fields["other"].default_factory is not None
    for s in STREAMS:
        if s.source_field is None:
            continue
        assert s.source_field in fields, s.name
        f = fields[s.source_field]
        assert f.default is None and f.annotation == str | None
        assert f.description == f"{s.description.capitalize()} ({', '.join(s.patterns)}).", s.name
    assert len({s.name for s in STREAMS}) == len(STREAMS)
    assert len({s.source_field for s in STREAMS if s.source_field}) == \
        len([s for s in STREAMS if s.source_field])


def test_a_block_saved_with_the_old_fields_still_loads() -> None:
    """The data of a block saved before `other` existed, as Prefect hands it to model_validate
    when it loads a block document."""
    saved = {"transcripts": "/srv/slm/transcripts", "research": None,
             "contacts": "/srv/slm/contacts", "max_document_mb": 4.0}
    block = DocumentSources.model_validate(saved)
    assert (block.transcripts, block.research, block.contacts, block.max_document_mb,
            block.other) == ("/srv/slm/transcripts", None, "/srv/slm/contacts", 4.0, {})
    assert [(s.name, f) for s, f in streams.configured(block)] == [
        ("transcripts", "/srv/slm/transcripts"), ("contacts", "/srv/slm/contacts")]
    assert DocumentSources.model_validate({}).other == {}


def test_the_loader_dispatch_keeps_ids_hashes_and_text(tmp_path: Path) -> None:
    root = tmp_path / "contacts"
    (root / "sub").mkdir(parents=True)
    data = json.dumps([{"name": "Ann Lee"}, {"name": "Bob Stone", "notes": "Met at expo."}])
    (root / "sub" / "c.json").write_text(data)
    d = load_document("contacts", root, root / "sub" / "c.json", 2 * MB)
    assert isinstance(d, Document)
    assert (d.id, d.stream, d.hash, d.text, d.metadata) == (
        "contacts/sub/c.json", "contacts", sha256_hex(data.encode()),
        "Notes on Bob Stone: Met at expo.", {"records": 2})
    assert load_document(by_name("contacts"), root, root / "sub" / "c.json", 2 * MB) == d
    with pytest.raises(ValueError, match="no document stream 'notes'"):
        load_document("notes", root, root / "sub" / "c.json", 2 * MB)


def test_a_fourth_stream_is_scanned_loaded_and_rooted(tmp_path: Path, with_notes: Stream) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.md").write_text("# A\n\nAnn Lee spoke.\n")
    notes = tmp_path / "n"
    (notes / "deep").mkdir(parents=True)
    (notes / "deep" / "b.txt").write_text("Cy Young wrote this.\n")
    (notes / "a.txt").write_text("  Ann Lee  \n")
    (notes / "empty.txt").write_text("\n \n")
    (notes / ".hidden.txt").write_text("never read")
    (notes / "skip.md").write_text("not a note")
    sources = DocumentSources(transcripts=str(tmp_path / "t"), other={"notes": str(notes)})
    roots = source_roots(sources)
    assert roots == {"transcripts": tmp_path / "t", "notes": notes}
    docs, failures = scan(roots, 2 * MB)
    assert [(d.id, d.stream, d.text, d.metadata) for d in docs] == [
        ("transcripts/a.md", "transcripts", "# A\n\nAnn Lee spoke.",
         {"title": "A", "date": None, "participants": [], "meeting_id": "a"}),
        ("notes/a.txt", "notes", "Ann Lee", {"title": "a"}),
        ("notes/deep/b.txt", "notes", "Cy Young wrote this.", {"title": "b"})]
    assert [(f.id, f.reason) for f in failures] == [
        ("notes/empty.txt", "empty file — remove it or add content")]
    assert streams.settings_text() == "transcripts, research, contacts or other.notes"


def test_a_fourth_stream_writes_its_own_rows_without_the_model(with_notes: Stream) -> None:
    from tasks.graph.ontology import default_schema

    doc = Document("notes/a.txt", "notes", "/n/a.txt", "h", "", {"title": "Budget"})
    batch = build_batch([DocOutcome(doc, [])], "m", {}, BatchReport(), default_schema())
    assert [(k, e.type, e.name) for k, e in batch.entities.items()] == [
        ("Topic:budget", "Topic", "Budget")]


def test_other_names_only_streams_read_from_there(tmp_path: Path, with_notes: Stream) -> None:
    sources = DocumentSources(transcripts=str(tmp_path), other={"nots": str(tmp_path),
                                                                "research": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"sources.other: nots, research is no stream read "
                                          r"from 'other' \(those are: notes;"):
        source_roots(sources)
    with pytest.raises(ConfigError, match="sources.other.notes: folder .*missing does not "
                                          "exist — create it, or fix 'other.notes'"):
        source_roots(DocumentSources(other={"notes": str(tmp_path / "missing")}))
    with pytest.raises(ConfigError, match="no stream configured — set transcripts, research, "
                                          "contacts or other.notes$"):
        source_roots(DocumentSources())


def test_a_stream_without_a_loader_of_its_own_is_not_read_as_contacts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the registry, a stream without a branch of its own fell through to contact JSON."""
    monkeypatch.setattr(streams, "STREAMS", (*STREAMS, NOTES))
    (tmp_path / "n.txt").write_text("[]")
    d = load_document("notes", tmp_path, tmp_path / "n.txt", 2 * MB)
    assert isinstance(d, Document) and d.text == "[]"
    failure = load_document("contacts", tmp_path, tmp_path / "n.txt", 2 * MB)
    assert isinstance(failure, LoadFailure)
    assert failure.reason == "empty contact list — remove the file or add records"


def test_relative_folders_in_other_are_taken_from_the_project_root(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text('[sources]\ntranscripts = "examples/transcripts"\n'
                 '[sources.other]\nnotes = "examples/notes"\nabs = "/srv/notes"\n')
    sources = load_profile(str(p)).sources
    assert sources.transcripts == str(ROOT / "examples" / "transcripts")
    assert sources.other == {"notes": str(ROOT / "examples" / "notes"), "abs": "/srv/notes"}
