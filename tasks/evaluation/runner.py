"""One eval run: the gold cases through phase 1's own code, against an endpoint.

Each case becomes one Document of the research stream (no deterministic front-matter rows)
titled as the case, so the request is the one a nightly sends for such a chunk. The cases go
through extract_documents together (the client paces them as in a night), then each case's
outcome through build_batch on its own, so its resolved entities and triples are exactly what
the graph would get from that chunk.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.engine.llama_cpp import default_model_path
from tasks.evaluation.gold import GoldCase
from tasks.evaluation.metrics import CasePrediction, PredictedEntity, score
from tasks.extraction.answers import BatchReport, build_batch
from tasks.extraction.calls import ExtractionConfig, extract_documents, run_sync
from tasks.extraction.chunking import chunk_text
from tasks.extraction.documents import Document
from tasks.extraction.inputs import chunk_tokens, llm_client, response_schema
from tasks.extraction.llm import Usage
from tasks.extraction.prompt import prompt_digest
from tasks.shared.errors import ConfigError
from tasks.shared.files import sha256_hex

if TYPE_CHECKING:
    from tasks.extraction.llm import Dialect

ROOT = Path(__file__).resolve().parents[2]
FORMAT = "slm-nightly/eval-extraction"
FORMAT_VERSION = 1
# A model this small cannot be judged by these figures: the eval says so in its output.
_SMALL = re.compile(r"(?<![\d.])\d{1,3}(?:\.\d+)?M\b", re.I)


def small_model_note(model: str) -> str | None:
    """The honest line for a model of under a billion parameters (by its name), else None."""
    if "smollm2-135m" in model.lower():
        return ("SmolLM2-135M is a 135M-parameter model: these figures test the plumbing "
                "(requests, parsing, resolution, scoring), not the quality of extraction a "
                "production model would give")
    if _SMALL.search(model):
        return (f"{model} is a model of under a billion parameters: these figures test the "
                "plumbing, not extraction quality")
    return None


@dataclass(frozen=True)
class Gold:
    """The gold cases an eval runs: the split they were chosen by, and the file they were read
    from with its digest (load_gold), which the result records."""

    cases: list[GoldCase]
    split: str
    path: Path
    digest: str


@dataclass
class Engine:
    base_url: str
    dialect: Dialect
    started_here: bool  # this run started (and stops) the profile's local llama-server
    model_path: str | None = None


def _stop_on_signals() -> Callable[[], None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt (as Ctrl-C does), so the `finally` that stops
    the server runs; returns the undo."""
    def on(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"interrupted by {signal.Signals(signum).name}")

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {s: signal.signal(s, on) for s in (signal.SIGTERM, signal.SIGHUP)}

    def undo() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return undo


@contextmanager
def engine(cfg: Any, base_url: str | None, say: Callable[[str], None]) -> Iterator[Engine]:
    """The endpoint to ask: `base_url`; else the profile's [inference] base_url (an external
    server); else, where the node runs its engine on this machine (Node.engine_here: a
    local-compute profile), its own llama-server started as the nightly starts it
    (start_inference: the profile's model, context, slots and threads) and stopped on the way
    out, also on an error or Ctrl-C. It runs under <state_dir>/eval-engine, so a nightly's own
    server is never touched."""
    endpoint = cfg.inference
    url = base_url or endpoint.base_url
    if url:
        yield Engine(url, endpoint.dialect, started_here=False)
        return
    node = cfg.node.engine_here(Path(cfg.state_dir) / "eval-engine")
    if node is None:
        raise ConfigError("eval: the profile's inference server runs on a GCE node, which the "
                          "eval does not boot — pass --base-url URL of a running endpoint")
    model = node.base_model or str(default_model_path())
    undo = _stop_on_signals()
    try:
        node.start()
        say(f"starting llama-server ({endpoint.model}, {model}, {node.cpu_threads} thread(s))")
        t = time.monotonic()
        url = node.start_inference(endpoint)
        say(f"llama-server ready at {url} in {time.monotonic() - t:.1f} s")
        yield Engine(url, endpoint.dialect, started_here=True, model_path=model)
    finally:
        if node.stop_inference():
            say("llama-server stopped")
        undo()


def shown(path: str | Path | None) -> str | None:
    """A path as the result records it: from the project root when inside it (a baseline
    kept in the repository says the same on every machine)."""
    if path is None:
        return None
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def _document(case: GoldCase) -> Any:
    return Document(id=case.id, stream="research", path=f"gold:{case.id}",
                    hash=sha256_hex(case.text), text=case.text,
                    metadata={"title": case.title or case.id})


def _prediction(outcome: Any, batch: Any, report: Any) -> CasePrediction:
    pred = CasePrediction(outcome.doc.id)
    if outcome.error or outcome.deferred:
        pred.error = outcome.error or "deferred (deadline)"
        pred.error_type = outcome.error_type or "Deferred"
        return pred
    pred.entities = [PredictedEntity(r.key, r.type, (r.name, *r.aliases))
                     for r in batch.entities.values()]
    pred.relationships = list(batch.relationships)
    # the pipeline's own count (tasks/extraction/answers.py grounded): names in their chunk
    pred.grounded, pred.ungrounded = report.grounded_names, report.ungrounded_names
    return pred


def run_eval(cfg: Any, profile: str, gold_set: Gold, base_url: str | None,
             say: Callable[[str], None]) -> dict[str, Any]:
    """Extract every case, score it, and return the result (the JSON the CLI writes)."""
    cases, split = gold_set.cases, gold_set.split
    gold = {"path": shown(gold_set.path), "digest": gold_set.digest, "cases": len(cases)}
    endpoint = cfg.inference
    ontology = cfg.extraction.ontology()
    gleanings = cfg.extraction.gleanings
    started = time.monotonic()
    note = small_model_note(endpoint.model)
    say(f"model {endpoint.model} ({endpoint.dialect}); {len(cases)} case(s) of split {split}")
    if note:
        say(f"NOTE: {note}")
    size = chunk_tokens(endpoint, ontology, gleanings)
    split_cases = [c.id for c in cases if len(chunk_text(c.text, size)) > 1]
    done: list[str] = []

    def on_done(outcome: Any) -> None:
        done.append(outcome.doc.id)
        what = (f"FAILED ({outcome.error_type}: {outcome.error[:120]})" if outcome.error else
                "deferred" if outcome.deferred else
                f"{sum(len(x.entities) for x in outcome.extraction)} entities, "
                f"{sum(len(x.relationships) for x in outcome.extraction)} relationships")
        say(f"case {len(done)}/{len(cases)} {outcome.doc.id}: {what}")

    with engine(cfg, base_url, say) as eng:
        client = replace(llm_client(endpoint, eng.base_url), usage=Usage())
        outcomes = run_sync(extract_documents(
            client, ExtractionConfig(endpoint.model, response_schema(endpoint, ontology), size,
                                     endpoint.chunk_overlap_tokens, ontology, gleanings),
            [_document(c) for c in cases], on_done))
    preds: dict[str, CasePrediction] = {}
    total = BatchReport()
    for o in outcomes:
        report = BatchReport()
        batch = build_batch([o], endpoint.model, {}, report, ontology=ontology,
                            gleanings=gleanings)
        preds[o.doc.id] = _prediction(o, batch, report)
        total.add_labels(report)
    overall, per_split, scores = score(cases, preds)
    usage = client.usage
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "profile": profile, "split": split, "model": endpoint.model,
        "engine": {"dialect": eng.dialect, "base_url": eng.base_url,
                   "started_here": eng.started_here, "model_path": shown(eng.model_path)},
        "schema": {"path": shown(ontology.path), "digest": ontology.digest()},
        "prompt_digest": prompt_digest(ontology),
        "gleanings": gleanings,
        "gold": gold,
        "note": note,
        "seconds": round(time.monotonic() - started, 2),
        "chunk_tokens": size,
        "cases_split_into_chunks": split_cases,
        "llm": {"calls": usage.calls, "retries": usage.retries,
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens},
        "unusable_answers": {"total": sum(usage.unusable_answers.values()),
                             "by_reason": dict(usage.unusable_answers)},
        # what phase 1 mended or dropped on the way (counts over all cases)
        "pipeline": {"pruned_relationships": sum(total.pruned_relationships.values()),
                     "reversed_relationships": sum(total.reversed_relationships.values()),
                     "dangling_relationships": total.dangling_relationships,
                     "rejected_entity_types": sum(total.rejected_entity_types.values()),
                     "aliases_resolved": total.aliases_resolved,
                     "gleaning_failures": total.gleaning_failures,
                     "ungrounded_samples": total.ungrounded},
        "failed": [{"id": s.case_id, "error": s.error_type, "message": s.error}
                   for s in scores if s.error],
        "figures": overall,
        "splits": per_split,
        "cases": [{"id": s.case_id, "split": s.split, "complete": s.complete,
                   "missed": s.missed, "wrong": s.wrong,
                   "predicted": [f"{p.type} {p.names[0]}" for p in preds[s.case_id].entities]
                   if s.case_id in preds else [],
                   **({"error": s.error} if s.error else {})} for s in scores],
    }
