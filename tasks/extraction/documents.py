"""Reading the document streams: every file of a stream's folder, by the stream's patterns,
through the stream's loader (tasks/extraction/streams.py).

Every file becomes either a Document (stable id, content hash, the text the LLM reads and any
structured records) or a LoadFailure with a reason. Nothing raises on bad input. What is the
same for every stream is here: the id "<stream>/<relative path>", the hash of the bytes, the
size limit, UTF-8, and a file that gives neither text nor records failing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from tasks.extraction import streams
from tasks.extraction.loaders import Document, LoadFailure, decode
from tasks.extraction.streams import Stream
from tasks.shared.errors import DocumentError
from tasks.shared.files import sha256_hex

__all__ = ["Document", "LoadFailure", "iter_paths", "load_document", "scan"]


def _stream(stream: str | Stream) -> Stream:
    return stream if isinstance(stream, Stream) else streams.by_name(stream)


def load_document(stream: str | Stream, root: Path, path: Path,
                  max_bytes: int) -> Document | LoadFailure:
    """One file of `stream` (a registered stream's name, or the Stream) under `root`."""
    s = _stream(stream)
    rel = path.relative_to(root).as_posix()
    doc_id = f"{s.name}/{rel}"
    try:
        raw = path.read_bytes()
    except OSError as e:
        return LoadFailure(doc_id, s.name, str(path), None, f"unreadable: {e.strerror}")
    digest = sha256_hex(raw)
    try:
        parsed = s.loader(decode(raw, max_bytes), path)
        if not parsed.text.strip() and not parsed.records:
            raise DocumentError("no text after the front matter — add content or remove the file")
    except DocumentError as e:
        return LoadFailure(doc_id, s.name, str(path), digest, str(e))
    except RecursionError:
        return LoadFailure(doc_id, s.name, str(path), digest, "nesting too deep to parse")
    return replace(parsed, id=doc_id, stream=s.name, path=str(path), hash=digest)


def iter_paths(stream: str | Stream, root: Path) -> Iterator[Path]:
    """The files of `stream` under `root`, sorted: its patterns, hidden files and folders
    skipped."""
    s = _stream(stream)
    seen: set[Path] = set()
    for pattern in s.patterns:
        for p in root.rglob(pattern):
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts):
                seen.add(p)
    yield from sorted(seen)


def scan(roots: dict[str, Path], max_bytes: int) -> tuple[list[Document], list[LoadFailure]]:
    """Load every document of every configured stream (`roots`: stream name → folder, in the
    order they are read)."""
    docs: list[Document] = []
    failures: list[LoadFailure] = []
    for name, root in roots.items():
        stream = streams.by_name(name)
        for path in iter_paths(stream, root):
            item = load_document(stream, root, path, max_bytes)
            (docs if isinstance(item, Document) else failures).append(item)  # type: ignore[arg-type]
    return docs, failures
