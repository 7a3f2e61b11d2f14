"""One phase-1 run over its plan: the documents a budget left last time go first, the batches
run under the budget (the slowest graph write sets what is kept back for the finish), their
reports fold into the run's totals, and the totals make the run's ExtractionReport. The
`extract` flow (flows/extract.py) calls these in order.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from tasks.extraction.answers import BatchReport
from tasks.extraction.batch import append_dead_letters, failure_record, record_failures
from tasks.extraction.chunking import estimate_tokens
from tasks.extraction.documents import Document, LoadFailure
from tasks.extraction.llm import LLMClient
from tasks.extraction.plan import Plan
from tasks.extraction.prompt import extraction_version
from tasks.extraction.setup import Phase1Setup
from tasks.extraction.stages import count_documents, extract_batch, retract_deleted
from tasks.graph.ontology import GraphSchema
from tasks.graph.open import snapshot_writer
from tasks.graph.snapshots import GraphDamaged, damage_message, keep_snapshot
from tasks.graph.store import GraphStore, batched
from tasks.records import (
    AnswerQuality,
    DocumentCounts,
    ExtractionReport,
    FailedDocument,
    GraphSummary,
    SnapshotFailed,
    grounded_precision,
)
from tasks.shared.errors import PhaseFailed, ServerDied
from tasks.shared.files import write_atomic

PENDING_FILE = "phase1-pending.json"  # <state_dir>/…: documents a budget left, first next run
# Kept back from the budget for what follows the last requests: that batch's graph writes, the
# orphan prune, the stats and the snapshot. FINISH_RESERVE_SECONDS until a batch write is
# measured; then FINISH_FLOOR_SECONDS + 1.5 × the slowest write measured (bench/deadline.py: a
# 0.2 s write, 0.2 s of finishing — a fixed 2 s ended a 40 s budget 5.9 % early).
FINISH_RESERVE_SECONDS = 2.0
FINISH_FLOOR_SECONDS = 0.25


def pending_first(state_dir: Path, docs: list[Document]) -> tuple[list[Document], int]:
    """The documents a budget left pending last time go first (in their order), then the rest;
    and how many of them are still to do."""
    path = state_dir / PENDING_FILE
    try:
        ids = json.loads(path.read_text(encoding="utf-8")).get("ids", [])
    except (OSError, ValueError, AttributeError):
        return docs, 0
    rank = {i: n for n, i in enumerate(ids)}
    first = sorted((d for d in docs if d.id in rank), key=lambda d: rank[d.id])
    return first + [d for d in docs if d.id not in rank], len(first)


def save_pending(state_dir: Path, ids: list[str]) -> None:
    path = state_dir / PENDING_FILE
    if not ids:
        path.unlink(missing_ok=True)
        return
    write_atomic(path, json.dumps({"ids": ids, "written_at": datetime.now(UTC).isoformat(
        timespec="seconds")}, indent=1))


@dataclass
class Budget:
    """Phase 1's deadline (epoch seconds; None: none) and what is kept back from it for the
    finish."""

    deadline: float | None
    began: float
    reserve: float = FINISH_RESERVE_SECONDS
    slowest: float = 0.0

    @classmethod
    def of(cls, deadline: float | None, budget_seconds: float | None) -> Budget:
        """The earlier of `deadline` and `budget_seconds` from now."""
        began = time.time()
        if budget_seconds is not None:
            own = began + max(0.0, budget_seconds)
            deadline = own if deadline is None else min(deadline, own)
        return cls(deadline, began)

    def requests_until(self) -> float | None:
        """When the last request must have ended: the deadline less the reserve."""
        return None if self.deadline is None else self.deadline - self.reserve

    def measured(self, write_seconds: float) -> None:
        self.slowest = max(self.slowest, write_seconds)
        self.reserve = FINISH_FLOOR_SECONDS + 1.5 * self.slowest

    def seconds(self) -> float | None:
        return None if self.deadline is None else round(self.deadline - self.began, 2)

    def log(self) -> None:
        if self.deadline is not None:
            get_run_logger().info("phase-1 budget: %.0f s (until %s)", self.deadline - self.began,
                                  datetime.fromtimestamp(self.deadline, UTC).isoformat(
                                      timespec="seconds"))


@dataclass
class Batches:
    """What the batches did: their reports folded into one, and how the loop ended."""

    queue: list[Document]
    totals: BatchReport = field(default_factory=BatchReport)
    died: str | None = None  # the inference server died: how (ServerDied)
    seconds: float = 0.0  # spent on batches (LLM + graph writes): the rate's clock

    def save_pending(self, state_dir: Path) -> None:
        """The deferred documents, first on the next run (and a warning when the budget, not
        the server's death, left them)."""
        save_pending(state_dir, self.totals.deferred)
        if self.totals.deferred and not self.died:
            get_run_logger().warning("phase 1 PARTIAL: the budget ended it with %d documents "
                                     "pending (~%d tokens); they go first on the next run",
                                     len(self.totals.deferred), self.pending()[1])

    def pending(self) -> tuple[Counter[str], int]:
        """The deferred documents by stream, and their estimated prompt tokens."""
        by_id = {d.id: d for d in self.queue}
        deferred = self.totals.deferred
        return (Counter(by_id[i].stream for i in deferred),
                sum(estimate_tokens(by_id[i].text) for i in deferred))


def run_batches(setup: Phase1Setup, store: GraphStore, client: LLMClient, work: Plan,
                budget: Budget) -> Batches:
    """The plan's documents in batches of `setup.batch_documents` (those a budget left pending
    last time first), each an extract-batch task, until the budget closes the gate or the
    server dies; the rest is deferred (no request sent, nothing marked or failed) and saved as
    pending for the next run."""
    logger = get_run_logger()
    queue, first = pending_first(setup.state_dir, work.extract)
    if first:
        logger.info("%d documents left pending by the last run's budget go first", first)
    budget.log()
    progress = cast(UUID, create_progress_artifact(
        0.0, key="extraction-progress", description="Phase 1: documents extracted (%)"))
    batches = list(batched(queue, setup.batch_documents))
    planned, changed = len(work.extract), set(work.changed)
    out = Batches(queue)
    total, done = out.totals, 0
    started = time.monotonic()
    for i, batch in enumerate(batches, 1):
        if total.deferred:  # the budget closed the gate: the rest waits, no request is sent
            total.deferred.extend(d.id for d in batch)
            continue
        try:
            rep = extract_batch(list(batch), store, client, setup.ask, changed)
        except ServerDied as e:
            # Nothing of this batch was written or marked: it and the rest stay pending
            # (first on the next run), none is failed for the server's death.
            out.died = str(e)
            logger.error("phase 1 stopped: %s", out.died)
            total.deferred.extend(d.id for d in batch)
            continue
        if budget.deadline is not None:  # the slowest write so far sets what is kept back
            budget.measured(rep.write_seconds)
            client.deadline = budget.requests_until()
        total.add(rep)
        done += len(batch) - len(rep.deferred)
        update_progress_artifact(progress, 100.0 * done / max(planned, 1))
        logger.info("batch %d/%d: %d/%d documents, %d LLM calls so far, %d failed%s",
                    i, len(batches), done, planned, total.usage.calls, len(total.failed),
                    f", {len(rep.deferred)} pending (out of budget)" if rep.deferred else "")
    out.seconds = time.monotonic() - started
    out.save_pending(setup.state_dir)
    return out


@dataclass
class Failures:
    """The run's failure rows (tasks/extraction/batch.py failure_record), by kind."""

    load_failed: list[FailedDocument]
    bad_records: list[FailedDocument]  # listed every run until fixed, like load failures
    failed: list[FailedDocument]
    held: list[FailedDocument]

    @classmethod
    def of(cls, docs: list[Document], load_failures: list[LoadFailure],
           held: list[tuple[Document, str]], failed: list[FailedDocument]) -> Failures:
        return cls(
            [failure_record(f, "DocumentError", f.reason) for f in load_failures],
            record_failures(docs), failed,
            [failure_record(d, "HeldAfterFailure", f"unchanged since it failed ({reason}); not "
                            "retried — fix the document or run with --retry-failed")
             for d, reason in held])

    def dead_letters(self) -> list[FailedDocument]:
        """What goes to the dead-letter file (held documents are there from their failure)."""
        return self.load_failed + self.bad_records + self.failed

    def listed(self) -> list[FailedDocument]:
        return self.load_failed + self.bad_records + self.failed + self.held


def check_graph(setup: Phase1Setup, store: GraphStore, full: bool) -> str:
    """The graph against the ledger's counts (tasks/graph/snapshots.py GraphCounts): its verdict,
    or GraphDamaged naming the ways back unless `full` re-extracts every document."""
    check, why = setup.ledger.check(store.stats())
    if check == "damaged" and not full:
        raise GraphDamaged(damage_message(why, setup.profile, setup.snapshots))
    get_run_logger().info("graph check: %s — %s%s", check, why,
                          " (re-extracting every document: --full)" if check == "damaged"
                          else "")
    return check


def begin_writes(setup: Phase1Setup, store: GraphStore, work: Plan, run_id: str | None) -> None:
    """Before the first write: the ledger notes that this run writes (a crash mid-way is then
    not mistaken for damage), and the deleted documents lose their provenance."""
    if work.deleted or work.extract:
        setup.ledger.begin_write(run_id)
    if work.deleted:
        retract_deleted(store, work.deleted)


def graph_summary(setup: Phase1Setup, store: GraphStore, work: Plan, check: str,
                  run_id: str | None) -> tuple[GraphSummary, list[dict[str, Any]]]:
    """After the batches: the counts recorded in the ledger, a snapshot when the run wrote
    (tasks/graph/snapshots.py keep_snapshot), and the graph's summary and top entities."""
    stats = store.stats()
    setup.ledger.record(stats, run_id)
    top = store.top_entities(10)
    snapshot = keep_snapshot(setup.snapshots, snapshot_writer(setup.graph, store, stats), stats,
                             run_id, changed=bool(work.deleted or work.extract))
    if isinstance(snapshot, SnapshotFailed):
        get_run_logger().warning("graph snapshot not taken: %s", snapshot.error)
    return GraphSummary(location=store.location, description=setup.snapshots.graph, **stats,
                        check=check, snapshot=snapshot), top


def log_plan(work: Plan, unreadable: int, ontology: GraphSchema) -> None:
    logger = get_run_logger()
    logger.info("%d to extract, %d unchanged (skipped), %d unchanged since they failed "
                "(held; retry with --retry-failed), %d deleted, %d unreadable",
                len(work.extract), len(work.skipped), len(work.held), len(work.deleted),
                unreadable)
    if work.reasons:
        logger.info("extracted again: %s%s", ", ".join(
            f"{n} for {why}" for why, n in sorted(work.reasons.items())),
            f" (graph schema {ontology.path}, digest {ontology.digest()[:8]}; prompt "
            "and schema digests make the extraction version)"
            if work.reasons.get("extraction version") else "")


@dataclass
class Phase1Run:
    """What one run of phase 1 did, for its report: the documents scanned and those that did
    not load, the plan, the batches, the orphans pruned, the graph after, the budget and when
    it started (time.monotonic())."""

    docs: list[Document]
    load_failures: list[LoadFailure]
    work: Plan
    out: Batches
    pruned: int
    graph: GraphSummary
    budget: Budget
    started: float

    @cached_property
    def failures(self) -> Failures:
        return Failures.of(self.docs, self.load_failures, self.work.held,
                           self.out.totals.failed)


def extraction_report(setup: Phase1Setup, run: Phase1Run,
                      endpoints: dict[str, dict[str, Any]]) -> ExtractionReport:
    """The run's record from its totals; its new failure rows appended to the dead-letter
    file. `endpoints`: the client's per-URL stats (LLMClient.stats)."""
    t, usage, fails = run.out.totals, run.out.totals.usage, run.failures
    append_dead_letters(setup.dead_letter, fails.dead_letters())
    counts = count_documents(run.docs, run.load_failures, run.work.skipped, t.extracted,
                             fails.failed + fails.held, list(setup.roots))
    pending, pending_tokens = run.out.pending()
    listed = fails.listed()
    ontology, gleanings = setup.ask.ontology, setup.ask.gleanings
    return ExtractionReport(
        documents={stream: DocumentCounts(**c) for stream, c in counts.items()},
        llm_calls=usage.calls,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        llm_retries=usage.retries,
        entities=t.entities,
        relationships=t.relationships,
        deleted=len(run.work.deleted),
        pruned=run.pruned,
        rejected_entity_types=dict(t.rejected_entity_types),
        remapped_relationship_types=dict(t.remapped_relationship_types),
        dropped_fields=dict(t.dropped_fields),
        unusable_answers=dict(usage.unusable_answers),
        bad_records=dict(Counter(r.stream for r in fails.bad_records)),
        dangling_relationships=t.dangling_relationships,
        namesakes_linked=t.namesakes_linked,
        unlinked_people=t.unlinked,
        namesakes_apart=t.namesakes_apart,
        joins=dict(t.joins),
        quality=AnswerQuality(
            grounded_names=t.grounded_names, ungrounded_names=t.ungrounded_names,
            grounded_precision=grounded_precision(t.grounded_names, t.ungrounded_names),
            ungrounded=t.ungrounded,
            dropped_ungrounded=dict(t.dropped_ungrounded),
            pruned_relationships=dict(t.pruned_relationships),
            reversed_relationships=dict(t.reversed_relationships),
            aliases_resolved=t.aliases_resolved, gleanings=gleanings,
            gleaning_failures=t.gleaning_failures, graph_schema=ontology.path,
            extraction_version=extraction_version(ontology, gleanings)),
        failures=listed,
        dead_letter=str(setup.dead_letter.resolve()) if listed else None,
        graph=run.graph,
        seconds=round(time.monotonic() - run.started, 2),
        status="partial" if t.deferred else "completed",
        pending=dict(pending),
        pending_tokens=pending_tokens,
        budget_seconds=run.budget.seconds(),
        extract_seconds=round(run.out.seconds, 2),
        endpoints=endpoints,
    )


def raise_if_failed(setup: Phase1Setup, run: Phase1Run, report: ExtractionReport) -> None:
    """PhaseFailed (carrying the report) when the server died, or when more than
    `setup.max_failed_share` of the documents attempted failed."""
    out, fails, share = run.out, run.failures, setup.max_failed_share
    deferred = out.totals.deferred
    if out.died:
        raise PhaseFailed(f"{out.died}\n{len(deferred)} documents were not extracted: they go "
                          f"first on the next run (listed in {setup.state_dir / PENDING_FILE})",
                          report)
    attempted = len(run.work.extract) - len(deferred) + len(run.load_failures)
    failed = len(fails.load_failed + fails.failed)
    if attempted and failed / attempted > share:
        raise PhaseFailed(f"{failed} of {attempted} documents failed (more than "
                          f"{share:.0%}); reasons in {setup.dead_letter} — fix them or raise "
                          "max_failed_share", report)
