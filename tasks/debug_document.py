"""One document through phase 1, step by step, for a notebook: the prompt, the raw model
answer, the validated extraction, the graph rows, and an upsert into a scratch graph.

It takes a whole Profile, so it sits beside tasks/profile.py, above the extraction and graph
domains it drives (notebooks/debug_document.ipynb)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from tasks.extraction.answers import BatchReport, build_batch
from tasks.extraction.calls import DocOutcome, extract_document, run_sync
from tasks.extraction.chunking import chunks
from tasks.extraction.documents import Document, LoadFailure, load_document
from tasks.extraction.inputs import chunk_tokens, llm_client, source_roots
from tasks.extraction.prompt import system_prompt, user_prompt
from tasks.extraction.setup import ask_for
from tasks.graph.store import GraphBatch, GraphStore
from tasks.profile import Profile


def load(cfg: Profile, path: str | Path) -> Document:
    """Load one file of the profile's sources; a file that cannot be loaded raises with why."""
    path = Path(path).resolve()
    for stream, root in source_roots(cfg.sources).items():
        if path.is_relative_to(root.resolve()):
            item = load_document(stream, root.resolve(), path,
                                 int(cfg.sources.max_document_mb * 1e6))
            if isinstance(item, LoadFailure):
                raise ValueError(f"{item.id}: {item.reason}")
            return item
    raise ValueError(f"{path} is under none of the profile's source folders "
                     f"{[str(r) for r in source_roots(cfg.sources).values()]}")


def prompts(cfg: Profile, doc: Document) -> list[dict[str, str]]:
    """The exact messages each chunk sends."""
    ep, ex = cfg.inference, cfg.extraction
    ontology = ex.ontology()
    parts = chunks(doc.text, chunk_tokens(ep, ontology, ex.gleanings),
                   ep.chunk_overlap_tokens) if doc.text.strip() else []
    return [{"system": system_prompt(ontology), "user": user_prompt(doc, c.text, c.index + 1,
                                                                    len(parts))}
            for c in parts]


def extract(cfg: Profile, doc: Document, base_url: str) -> tuple[DocOutcome, dict[str, Any]]:
    """Run the document through the endpoint; returns the outcome and the usage."""
    ep, ex = cfg.inference, cfg.extraction
    ontology = ex.ontology()
    c = llm_client(ep, base_url)

    async def go() -> DocOutcome:
        async with c:
            return await extract_document(c, ask_for(ep, ontology, ex.gleanings), doc)

    return run_sync(go()), asdict(c.usage)  # notebooks already run an event loop


def graph_rows(doc: Document, outcome: DocOutcome, model: str, cfg: Profile | None = None
               ) -> tuple[GraphBatch, BatchReport]:
    """The rows phase 1 would upsert (deterministic fields and the LLM's entities, pruned
    and resolved under the profile's graph schema; the shipped one without a profile)."""
    report = BatchReport()
    ontology = cfg.extraction.ontology() if cfg else None
    return build_batch([outcome], model, {}, report, ontology,
                       cfg.extraction.gleanings if cfg else 0), report


def upsert_scratch(store: GraphStore, batch: GraphBatch) -> dict[str, Any]:
    """Write the rows into the given (scratch) store and read back what landed."""
    store.ensure_schema()
    store.upsert(batch)
    return {"stats": store.stats(),
            "entities": store.query("MATCH (e:Entity) RETURN e.type AS type, e.name AS name, "
                                    "e.aliases AS aliases ORDER BY type, name"),
            "relationships": store.query("MATCH (a)-[r]->(b) WHERE type(r) <> 'MENTIONED_IN' "
                                         "RETURN a.name AS source, type(r) AS type, "
                                         "b.name AS target")}

