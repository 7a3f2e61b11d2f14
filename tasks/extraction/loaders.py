"""What a document file becomes: a Document or a LoadFailure, and the loaders of the shipped
streams, each one file's text → what the LLM reads, its metadata and its records
(Document.read).

A loader sees text already decoded and checked (tasks/extraction/documents.py reads the file,
hashes it, enforces the size limit and UTF-8, and turns a DocumentError into a LoadFailure);
it raises DocumentError with the reason and the fix. The registry of streams that names these
loaders is tasks/extraction/streams.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tasks.shared.errors import DocumentError


@dataclass(frozen=True)
class Document:
    """One file of a stream: who it is (its id, stream, path and the sha256 of its bytes) and
    what its loader read — the text the LLM reads ("" when nothing needs the model), metadata
    (a `title` names the document in the prompt), structured records (the rows written
    without the model read them) and the records that failed, each {"record": index,
    "reason": …}. A file with neither text nor records fails."""

    id: str  # "<stream>/<relative path>": stable across runs and machines
    stream: str
    path: str
    hash: str  # sha256 of the file's bytes
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    bad_records: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, text: str, metadata: dict[str, Any] | None = None,
             records: list[dict[str, Any]] | None = None,
             bad_records: list[dict[str, Any]] | None = None) -> Document:
        """What a loader returns: the content alone; load_document gives it its identity."""
        return cls("", "", "", "", text, metadata or {}, records or [], bad_records or [])


@dataclass(frozen=True)
class LoadFailure:
    id: str
    stream: str
    path: str
    hash: str | None
    reason: str


# A stream's loader: the file's decoded text and its path → Document.read(…), or DocumentError.
Loader = Callable[[str, Path], Document]


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors/aliases: no alias bombs, and records never need them."""

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise DocumentError(
                f"YAML aliases are not allowed (line {event.start_mark.line + 1}); "
                "write the value out in full"
            )
        return super().compose_node(parent, index)


def load_yaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - safe loader subclass
    except yaml.YAMLError as e:
        raise DocumentError(f"malformed YAML: {str(e).splitlines()[0]} — fix the syntax") from e


class ContactRecord(BaseModel):
    """One contact. Structured fields map to the graph without the LLM; `notes` goes to it."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=200)
    emails: list[str] = []
    phones: list[str] = []
    organization: str | None = None
    title: str | None = None
    notes: str = ""

    @field_validator("emails", "phones", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        if v is None:
            return []
        return [v] if isinstance(v, str) else v

    @field_validator("emails")
    @classmethod
    def _emails(cls, v: list[str]) -> list[str]:
        out = []
        for e in v:
            e = e.strip().lower()
            if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", e):
                raise ValueError(f"not an e-mail address: {e!r}")
            out.append(e)
        return out


def decode(raw: bytes, max_bytes: int) -> str:
    """A file's bytes as text, or DocumentError: empty, over `max_bytes`, binary, not UTF-8."""
    if not raw.strip():
        raise DocumentError("empty file — remove it or add content")
    if len(raw) > max_bytes:
        raise DocumentError(
            f"too large ({len(raw) / 1e6:.1f} MB > {max_bytes / 1e6:.1f} MB limit) — split the "
            "file or raise the sources block's max_document_mb"
        )
    if b"\x00" in raw[:8192]:
        raise DocumentError("binary file (NUL bytes) — only UTF-8 text is read")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DocumentError(f"not valid UTF-8 at byte {e.start} — re-save the file as UTF-8") from e


def front_matter(text: str) -> tuple[dict[str, Any], str]:
    """A leading `---` YAML block as a mapping, and the text after it."""
    if not text.startswith("---"):
        return {}, text
    m = re.match(r"^---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|$)", text, re.S)
    if not m:
        raise DocumentError("front matter opened with '---' but never closed — add the closing '---'")
    meta = load_yaml(m.group(1)) or {}
    if not isinstance(meta, dict):
        raise DocumentError("front matter is not a YAML mapping — write 'key: value' lines")
    return meta, text[m.end():]


def load_transcript(text: str, path: Path) -> Document:
    """A meeting transcript (Markdown): the body for the LLM; title, date, participants and
    meeting id from the front matter (the title else the first heading, the id else the
    file's name)."""
    meta, body = front_matter(text)
    heading = re.search(r"^#\s+(.+)$", body, re.M)
    participants = meta.get("participants") or []
    if not isinstance(participants, list) or not all(isinstance(p, str) for p in participants):
        raise DocumentError("front matter 'participants' must be a list of names")
    title = meta.get("title") or (heading.group(1).strip() if heading else None) \
        or meta.get("meeting_id") or path.stem
    date = meta.get("date")
    return Document.read(body.strip(), {
        "title": str(title),
        "date": str(date) if date is not None else None,
        "participants": participants,
        "meeting_id": str(meta.get("meeting_id") or path.stem),
    })


_KIND = {str: "a string", int: "a number", float: "a number", bool: "a boolean",
         list: "a list", type(None): "nothing"}


def _split_records(items: list[Any], check: Callable[[int, Any], dict[str, Any]]
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Good records and bad ones ({"record": i, "reason": …}); `check(i, item)` returns the
    record or raises DocumentError. Every record bad: the file fails, with every reason."""
    good: list[dict[str, Any]] = []
    bad: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        try:
            good.append(check(i, item))
        except DocumentError as e:
            bad.append({"record": i, "reason": str(e)})
    if not good:
        reasons = "; ".join(b["reason"] for b in bad[:5]) + ("; …" if len(bad) > 5 else "")
        raise DocumentError(reasons if len(bad) == 1 else f"every record is bad: {reasons}")
    return good, bad


def _research_record(i: int, item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise DocumentError(f"record {i}: expected a mapping (key: value lines), got "
                            f"{_KIND.get(type(item), type(item).__name__)}")
    return item


def load_research(text: str, path: Path) -> Document:
    """Agent research: a Markdown note (its body; its front matter's plain values as
    metadata), or YAML records (a mapping or a list of them), rendered back as YAML for the
    LLM."""
    if path.suffix == ".md":
        meta, body = front_matter(text)
        return Document.read(body.strip(), {k: str(v) for k, v in meta.items() if isinstance(v, str | int)})
    data = load_yaml(text)
    if not isinstance(data, dict | list) or data == []:
        raise DocumentError("expected a YAML mapping or a list of mappings (research records)")
    records, bad = _split_records(data if isinstance(data, list) else [data], _research_record)
    rendered = yaml.safe_dump(records if len(records) > 1 else records[0], sort_keys=False,
                              allow_unicode=True, default_flow_style=False, width=100)
    title = records[0].get("title")
    return Document.read(rendered.strip(), {"title": str(title) if title else path.stem,
                                     "records": len(records)}, bad_records=bad)


def _contact_record(i: int, item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise DocumentError(f"record {i}: expected a JSON object with at least a 'name'")
    try:
        return ContactRecord.model_validate(item).model_dump()
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise DocumentError(f"record {i}: field '{loc}': {err['msg']}") from None


def load_contacts(text: str, path: Path) -> Document:
    """Contact records (JSON: one object or a list): the records, for the rows written
    without the model; their notes, for the LLM."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DocumentError(f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
    items = data if isinstance(data, list) else [data]
    if not items:
        raise DocumentError("empty contact list — remove the file or add records")
    records, bad = _split_records(items, _contact_record)
    notes = [f"Notes on {r['name']}: {r['notes'].strip()}" for r in records if r["notes"].strip()]
    return Document.read("\n".join(notes), {"records": len(records)}, records, bad)
