"""Token-aware chunking with overlap.

Token counts are estimated from characters (a conservative ~3.5 chars/token for English),
so no tokenizer has to be loaded; if the estimate is ever wrong the LLM client reports
`finish_reason == "length"` or a context error and the chunk is split again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CHARS_PER_TOKEN = 3.5


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Chunk:
    """One chunk of a document: its text as sent, and where it lies in the document's text
    (characters [start, end) — the first and last line it holds; the text between them is the
    same up to how line breaks and long-line cuts are written)."""

    index: int
    start: int
    end: int
    text: str


def _pieces(text: str, max_chars: int) -> list[tuple[int, int, str]]:
    """Lines (offset, end, text), with any line longer than max_chars cut at sentence or word
    boundaries."""
    out: list[tuple[int, int, str]] = []
    at = 0
    for raw in text.splitlines(keepends=True):
        line = raw.splitlines()[0] if raw.splitlines() else ""
        pos = at
        while len(line) > max_chars:
            cut = max(line.rfind(". ", 0, max_chars), line.rfind(" ", 0, max_chars))
            cut = cut + 1 if cut > max_chars // 2 else max_chars
            head = line[:cut].rstrip()
            out.append((pos, pos + len(head), head))
            rest = line[cut:]
            pos += cut + len(rest) - len(rest.lstrip())
            line = rest.lstrip()
        out.append((pos, pos + len(line), line))
        at += len(raw)
    return out


def chunks(text: str, max_tokens: int, overlap_tokens: int = 0) -> list[Chunk]:
    """Split text into chunks of at most ~max_tokens, each starting with the previous
    chunk's last ~overlap_tokens (whole lines), so an entity on a boundary is seen whole."""
    if max_tokens < 16:
        raise ValueError(f"max_tokens must be at least 16, got {max_tokens}")
    max_chars = int(max_tokens * CHARS_PER_TOKEN)
    overlap_chars = min(int(overlap_tokens * CHARS_PER_TOKEN), max_chars // 2)
    if len(text) <= max_chars:
        return [Chunk(0, 0, len(text), text)]
    groups: list[list[tuple[int, int, str]]] = []
    current: list[tuple[int, int, str]] = []
    size = 0
    for piece in _pieces(text, max_chars - overlap_chars):
        if current and size + len(piece[2]) + 1 > max_chars:
            groups.append(current)
            tail: list[tuple[int, int, str]] = []
            tail_size = 0
            for line in reversed(current):
                if tail_size + len(line[2]) + 1 > overlap_chars:
                    break
                tail.insert(0, line)
                tail_size += len(line[2]) + 1
            current, size = tail, tail_size
        current.append(piece)
        size += len(piece[2]) + 1
    if current and (not groups or any(line[2].strip() for line in current)):
        groups.append(current)
    out: list[Chunk] = []
    for g in groups:
        body = "\n".join(p[2] for p in g)
        if body.strip():
            out.append(Chunk(len(out), g[0][0], g[-1][1], body))
    return out


def chunk_text(text: str, max_tokens: int, overlap_tokens: int = 0) -> list[str]:
    """The chunks' texts (see chunks)."""
    return [c.text for c in chunks(text, max_tokens, overlap_tokens)]


def halve(text: str) -> list[str]:
    """Two halves split at the line (or space) nearest the middle: the retry after a
    'length' finish."""
    mid = len(text) // 2
    cut = text.rfind("\n", 0, mid)
    if cut < len(text) // 4:
        cut = text.rfind(" ", 0, mid)
    if cut <= 0:
        cut = mid
    return [p for p in (text[:cut].strip(), text[cut:].strip()) if p]

