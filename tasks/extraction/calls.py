"""The documents' free text through the LLM: chunk by chunk (concurrently), a chunk too long
halved, each chunk gleaned; what the model answered, per document, as a DocOutcome.

Deterministic parts (transcript participants, contact fields) never go to the LLM
(tasks/extraction/answers.py); free text does, chunked to fit the endpoint's context.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prefect.exceptions import TerminationSignal

from tasks.extraction.chunking import Chunk, chunks, estimate_tokens, halve
from tasks.extraction.documents import Document
from tasks.extraction.llm import LLMClient
from tasks.extraction.prompt import GLEAN_PROMPT, system_prompt, user_prompt
from tasks.extraction.schema import Extraction
from tasks.graph.ontology import GraphSchema, default_schema
from tasks.shared.errors import ChunkTooLong, Deferred, LLMError

MAX_SPLIT_DEPTH = 2


@dataclass(frozen=True)
class ExtractionConfig:
    """What phase 1 asks of the model and how a document is cut for it: the model, the bounded
    response schema, the graph schema (ontology), the gleaning passes per chunk, and the chunk
    size and overlap in tokens (tasks/extraction/setup.py builds it from the profile), and whether
    the model judges namesakes."""

    model: str
    schema: dict[str, Any]
    chunk_tokens: int
    overlap_tokens: int = 0
    ontology: GraphSchema = field(default_factory=default_schema)
    gleanings: int = 0
    judge: bool = False  # namesakes the evidence leaves open go to the model (judge.py)


@dataclass(frozen=True)
class ChunkPart:
    """One chunk's text as a request sends it: part `part` of `parts`."""

    text: str
    part: int
    parts: int


@dataclass
class ChunkAnswer:
    """One chunk and what the model answered for it (halves and gleanings included)."""

    chunk: Chunk
    answers: list[Extraction] = field(default_factory=list)


@dataclass
class DocOutcome:
    doc: Document
    chunks: list[ChunkAnswer] = field(default_factory=list)
    error: str | None = None
    error_type: str | None = None
    attempts: int = 0
    endpoint_down: bool = False  # failed because the endpoint was unreachable: not held
    unanswered: bool = False  # no attempt got an answer (timeouts, server down): not held
    # the deadline could not cover one of its requests: neither extracted nor failed, it
    # waits for the next run (what its other chunks returned is dropped)
    deferred: bool = False
    gleaning_failures: int = 0  # gleaning passes that got no usable answer (first kept)

    @property
    def extraction(self) -> list[Extraction]:
        return [a for c in self.chunks for a in c.answers]


def _answer_json(ex: Extraction) -> str:
    return json.dumps({"entities": [e.model_dump() for e in ex.entities],
                       "relationships": [r.model_dump() for r in ex.relationships]},
                      ensure_ascii=False)


async def _extract_chunk(client: LLMClient, ask: ExtractionConfig, doc: Document, piece: ChunkPart,
                         depth: int = 0) -> list[Extraction]:
    system = system_prompt(ask.ontology)
    prompt = user_prompt(doc, piece.text, piece.part, piece.parts)
    try:
        return [await client.extract(system, prompt, ask.schema, ontology=ask.ontology)]
    except ChunkTooLong as e:
        halves = halve(piece.text)
        if depth >= MAX_SPLIT_DEPTH or len(halves) < 2:
            if "max_tokens" not in str(e):
                raise  # the prompt itself does not fit
            # Nothing left to split: the answer, not the chunk, is too long (greedy decoding
            # that loops) — other samples of the same chunk.
            return [await client.extract(system, prompt, ask.schema, resample_cut=True,
                                         ontology=ask.ontology)]
        results = await asyncio.gather(*(
            _extract_chunk(client, ask, doc, ChunkPart(h, piece.part, piece.parts), depth + 1)
            for h in halves))
        return [x for r in results for x in r]


async def _glean(client: LLMClient, ask: ExtractionConfig, doc: Document, piece: ChunkPart,
                 first: list[Extraction]) -> tuple[list[Extraction], int]:
    """Ask `ask.gleanings` times for what the answers so far missed (GraphRAG's gleaning). A
    pass that gets no usable answer ends gleaning for the chunk; what was found is kept."""
    if len(first) != 1:  # the chunk was halved: its answers are of other prompts
        return [], 0
    history: list[dict[str, str]] = []
    last = first[0]
    more: list[Extraction] = []
    for _ in range(ask.gleanings):
        history += [{"role": "assistant", "content": _answer_json(last)},
                    {"role": "user", "content": GLEAN_PROMPT}]
        try:
            last = await client.extract(system_prompt(ask.ontology),
                                        user_prompt(doc, piece.text, piece.part, piece.parts),
                                        ask.schema, history=list(history), ontology=ask.ontology)
        except (LLMError, ChunkTooLong, Deferred):
            return more, 1
        if not last.entities and not last.relationships:
            break  # nothing missed: no further pass
        more.append(last)
    return more, 0


async def extract_document(client: LLMClient, ask: ExtractionConfig, doc: Document) -> DocOutcome:
    """Run the document's free text through the LLM, chunk by chunk (concurrently), each
    chunk gleaned `ask.gleanings` times. Every chunk ends before the outcome is decided (no
    request outlives its document): a failed chunk fails the document, else a deferred one
    defers it."""
    outcome = DocOutcome(doc)
    if not doc.text.strip():
        return outcome
    parts = chunks(doc.text, ask.chunk_tokens, ask.overlap_tokens)

    async def one(c: Chunk) -> tuple[list[Extraction], int]:
        piece = ChunkPart(c.text, c.index + 1, len(parts))
        got = await _extract_chunk(client, ask, doc, piece)
        if ask.gleanings:
            more, failed = await _glean(client, ask, doc, piece, got)
            return got + more, failed
        return got, 0

    results = await asyncio.gather(*(one(c) for c in parts), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, LLMError | Deferred):
            raise r
    errors = [r for r in results if isinstance(r, LLMError)]
    if errors:
        e = errors[0]
        outcome.error, outcome.error_type, outcome.attempts = str(e), type(e).__name__, e.attempts
        outcome.endpoint_down = e.endpoint_down
        outcome.unanswered = all(x.unanswered for x in errors)
    elif any(isinstance(r, Deferred) for r in results):
        outcome.deferred = True
    else:
        for c, r in zip(parts, results, strict=True):
            answers, failed = r  # type: ignore[misc]
            outcome.chunks.append(ChunkAnswer(c, answers))
            outcome.gleaning_failures += failed
    return outcome


async def extract_documents(client: LLMClient, ask: ExtractionConfig, docs: list[Document],
                            on_done: Callable[[DocOutcome], None] | None = None
                            ) -> list[DocOutcome]:
    """Every document through `extract_document` at once (the client paces the requests);
    `on_done` is told of each outcome as it ends."""
    async def one(d: Document) -> DocOutcome:
        outcome = await extract_document(client, ask, d)
        if on_done:
            on_done(outcome)
        return outcome

    async with client:
        return list(await asyncio.gather(*(one(d) for d in docs)))


def run_sync(coro: Any) -> Any:
    """asyncio.run, also from a thread that already has a running loop. A Ctrl-C or SIGTERM
    that lands inside an anyio task group (httpx's connect) leaves it wrapped in a
    BaseExceptionGroup: it is raised bare, so the flow and Prefect see the signal (a cancelled
    run, the signal re-delivered to `slm-nightly run`), not a failure. One that lands where
    asyncio would drop it stops the work too (`_signals_kept`)."""
    try:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(_signals_kept(coro))
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, _signals_kept(coro)).result()
    except BaseExceptionGroup as group:
        signal: BaseException | None = group.subgroup((KeyboardInterrupt, TerminationSignal))
        while isinstance(signal, BaseExceptionGroup):
            signal = signal.exceptions[0]
        if signal is None:
            raise
        raise signal from group


def _is_signal(exc: BaseException | None) -> bool:
    """TerminationSignal (Prefect's SIGTERM handler) and the like: neither an error nor a
    cancellation. KeyboardInterrupt and SystemExit never reach a loop's exception handler."""
    return exc is not None and not isinstance(exc, Exception | asyncio.CancelledError)


async def _signals_kept(coro: Any) -> Any:
    """Await `coro`; a signal that asyncio would only log cancels it and is raised instead.

    Prefect's SIGTERM handler raises TerminationSignal in whatever the main thread is running.
    In a plain loop callback (a socket read, a future waking its task) asyncio logs and drops
    any exception but KeyboardInterrupt and SystemExit (CPython 3.11 asyncio/events.py,
    Handle._run), and a background task keeps it until the task is collected, when it is only
    logged. Under load a SIGTERM landed there and the run went on to complete and exit 0 (CI,
    2026-12-04). Both reach the loop's exception handler, which this one replaces."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    caught: list[BaseException] = []
    previous = loop.get_exception_handler()

    def on_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if _is_signal(exc) and main is not None:
            if not caught:
                caught.append(exc)  # type: ignore[arg-type]
                main.cancel()
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(on_error)
    try:
        result = await coro
    except asyncio.CancelledError:
        if caught:
            raise caught[0] from None
        raise
    finally:
        loop.set_exception_handler(previous)
    if caught:  # the work swallowed the cancel and finished anyway
        raise caught[0]
    return result


def prompt_overhead_tokens(ontology: GraphSchema | None = None) -> int:
    return estimate_tokens(system_prompt(ontology or default_schema())) + 64
