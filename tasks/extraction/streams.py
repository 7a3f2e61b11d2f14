"""The document streams, in one registry: each stream's name, file patterns, loader, the rows
it writes without the model, and the DocumentSources field that holds its folder.

Everything that depends on which streams exist reads STREAMS (at call time, so a test may
add one): the scan and the loader dispatch (documents.py), the folders a run reads
(inputs.py source_roots), the rows written without the model (answers.py), the profile's
path fields (tasks/profile.py), the preflight's folder checks and their messages. The run's
per-stream counts are keyed by the folders configured, so a new stream shows there too.

A new stream is one more Stream below (docs/extending.md). Its folder is the DocumentSources
field named by `source_field`, or, with no field of its own, `sources.other[name]` (in a
profile: `[sources.other]` NAME = "folder"). Registry order is scan order.
"""

from __future__ import annotations

from dataclasses import dataclass

from blocks.sources import DocumentSources
from tasks.extraction.loaders import Loader, load_contacts, load_research, load_transcript
from tasks.extraction.rows import RowsWriter, contact_rows, transcript_rows


@dataclass(frozen=True)
class Stream:
    """One stream. `name` starts every document id ("<name>/<relative path>"), so renaming a
    stream re-extracts it; `patterns` are globs matched in the folder and below (hidden
    files and folders skipped); `loader` reads one file's text (tasks/extraction/loaders.py);
    `rows` writes what needs no model (tasks/extraction/rows.py), or None; `source_field` is
    the DocumentSources field holding the folder, None for `sources.other[name]`;
    `description` names the stream in messages."""

    name: str
    patterns: tuple[str, ...]
    loader: Loader
    description: str
    rows: RowsWriter | None = None
    source_field: str | None = None

    @property
    def setting(self) -> str:
        """Where a profile sets the folder, within [sources]: "transcripts", "other.notes"."""
        return self.source_field or f"other.{self.name}"

    @property
    def profile_key(self) -> str:
        """The same as a profile's table and key: "[sources] transcripts",
        "[sources.other] notes"."""
        return f"[sources] {self.source_field}" if self.source_field else \
            f"[sources.other] {self.name}"

    def folder(self, sources: DocumentSources) -> str | None:
        """The folder `sources` sets for this stream; None or "" when it is not configured."""
        if self.source_field:
            value = getattr(sources, self.source_field)
            return value if isinstance(value, str) else None
        return sources.other.get(self.name)


STREAMS: tuple[Stream, ...] = (
    Stream("transcripts", ("*.md",), load_transcript, "meeting transcripts",
           rows=transcript_rows, source_field="transcripts"),
    Stream("research", ("*.yaml", "*.yml", "*.md"), load_research, "agent research",
           source_field="research"),
    Stream("contacts", ("*.json",), load_contacts, "contact records",
           rows=contact_rows, source_field="contacts"),
)


def find(name: str) -> Stream | None:
    """The registered stream called `name`, or None."""
    return next((s for s in STREAMS if s.name == name), None)


def by_name(name: str) -> Stream:
    """The registered stream called `name`; ValueError naming the streams there are."""
    stream = find(name)
    if stream is None:
        raise ValueError(f"no document stream {name!r}: the streams are "
                         f"{', '.join(s.name for s in STREAMS)} (tasks/extraction/streams.py)")
    return stream


def configured(sources: DocumentSources) -> list[tuple[Stream, str]]:
    """Each stream `sources` gives a folder, with the folder as written, in registry order."""
    return [(s, folder) for s in STREAMS if (folder := s.folder(sources))]


def unknown_others(sources: DocumentSources) -> list[str]:
    """Names in `sources.other` that are no stream read from there (a typo, or a stream with
    a field of its own)."""
    known = {s.name for s in STREAMS if not s.source_field}
    return sorted(set(sources.other) - known)


def settings_text() -> str:
    """The settings that configure a stream, for messages: "transcripts, research or
    contacts"."""
    names = [s.setting for s in STREAMS]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
