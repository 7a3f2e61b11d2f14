"""Token-aware chunking with overlap.

Token counts are estimated from characters (a conservative ~3.5 chars/token for English),
so no tokenizer has to be loaded; if the estimate is ever wrong the LLM client reports
`finish_reason == "length"` or a context error and the chunk is split again.
"""

from __future__ import annotations

import math

CHARS_PER_TOKEN = 3.5


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _pieces(text: str, max_chars: int) -> list[str]:
    """Lines, with any line longer than max_chars cut at sentence or word boundaries."""
    out: list[str] = []
    for line in text.splitlines():
        while len(line) > max_chars:
            cut = max(line.rfind(". ", 0, max_chars), line.rfind(" ", 0, max_chars))
            cut = cut + 1 if cut > max_chars // 2 else max_chars
            out.append(line[:cut].rstrip())
            line = line[cut:].lstrip()
        out.append(line)
    return out


def chunk_text(text: str, max_tokens: int, overlap_tokens: int = 0) -> list[str]:
    """Split text into chunks of at most ~max_tokens, each starting with the previous
    chunk's last ~overlap_tokens (whole lines), so an entity on a boundary is seen whole."""
    if max_tokens < 16:
        raise ValueError(f"max_tokens must be at least 16, got {max_tokens}")
    max_chars = int(max_tokens * CHARS_PER_TOKEN)
    overlap_chars = min(int(overlap_tokens * CHARS_PER_TOKEN), max_chars // 2)
    if len(text) <= max_chars:
        return [text]
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for piece in _pieces(text, max_chars - overlap_chars):
        if current and size + len(piece) + 1 > max_chars:
            chunks.append("\n".join(current))
            tail: list[str] = []
            tail_size = 0
            for line in reversed(current):
                if tail_size + len(line) + 1 > overlap_chars:
                    break
                tail.insert(0, line)
                tail_size += len(line) + 1
            current, size = tail, tail_size
        current.append(piece)
        size += len(piece) + 1
    if current and (not chunks or any(line.strip() for line in current)):
        chunks.append("\n".join(current))
    return [c for c in chunks if c.strip()]


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

