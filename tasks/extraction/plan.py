"""Phase 1's plan: per document, skip, hold, extract again or retract, from the graph's
record of its last extraction."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tasks.extraction.calls import ExtractionConfig
from tasks.extraction.documents import Document, LoadFailure
from tasks.extraction.prompt import document_version


@dataclass
class Plan:
    extract: list[Document]
    skipped: list[Document]
    changed: list[str]  # ids already in the graph whose content (or model/prompt) changed
    deleted: list[str]  # ids in the graph whose file is gone
    held: list[tuple[Document, str]] = field(default_factory=list)  # failed before, unchanged
    # why the documents already in the graph are extracted again: "content", "model",
    # "extraction version" (the schema, the prompt or gleanings changed), "retry", "full"
    reasons: Counter[str] = field(default_factory=Counter)


def _why(st: dict[str, Any], d: Document, model: str, version: str) -> str:
    if st.get("hash") not in (None, d.hash) or st.get("failed_hash") not in (None, d.hash):
        return "content"
    if st.get("model", st.get("failed_model")) not in (None, model):
        return "model"
    if st.get("prompt_version", st.get("failed_prompt_version")) not in (None, version):
        return "extraction version"
    return "retry"


class Reextract(NamedTuple):
    """What is extracted again though unchanged: every document (`full`), or those that
    failed before (`retry_failed`)."""

    full: bool = False
    retry_failed: bool = False


def plan(docs: list[Document], failures: list[LoadFailure], states: dict[str, dict[str, Any]],
         ask: ExtractionConfig, streams: Iterable[str], redo: Reextract | None = None) -> Plan:
    """Decide per document: skip (unchanged since its last successful extraction), hold
    (unchanged since it failed), extract, or retract (deleted). A file that now fails to load
    keeps its old graph contribution. "Unchanged" is the same content, model and extraction
    version (tasks/extraction/prompt.py: the schema's and the prompt's digests)."""
    out = Plan([], [], [], [])
    model, ontology, gleanings = ask.model, ask.ontology, ask.gleanings
    full, retry_failed = redo or Reextract()
    for d in docs:
        st = states.get(d.id) or {}
        version = document_version(d, ontology, gleanings)
        key = (d.hash, model, version)
        fresh = (st.get("hash"), st.get("model"), st.get("prompt_version")) == key
        failed = (st.get("failed_hash"), st.get("failed_model"),
                  st.get("failed_prompt_version")) == key
        if fresh and not full:
            out.skipped.append(d)
        elif failed and not (full or retry_failed):
            out.held.append((d, str(st.get("failed_reason"))))
        else:
            out.extract.append(d)
            if st:
                out.changed.append(d.id)
                out.reasons["full" if full and (fresh or failed) else
                            "retry" if failed else _why(st, d, model, version)] += 1
    present = {d.id for d in docs} | {f.id for f in failures}
    streams = set(streams)
    out.deleted = sorted(i for i, st in states.items()
                         if i not in present and st.get("stream") in streams)
    return out
