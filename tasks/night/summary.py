"""The run summary (tasks/records/summary.py RunSummary): printed for people, written as JSON,
published as an artifact."""

from __future__ import annotations

from tasks.records import (
    AnswerQuality,
    CapacityReport,
    CostSummary,
    ExtractionReport,
    GraphSnapshot,
    NodeUsage,
    RunSummary,
    SnapshotFailed,
)


def new_summary(profile: str) -> RunSummary:
    return RunSummary(profile=profile, status="running", phases={})


def _extraction(s: RunSummary) -> ExtractionReport:
    """Phase 1's report, or zeros when it did not report (the summary prints them)."""
    return s.extraction or ExtractionReport.empty()


def _training_lines(s: RunSummary) -> list[str]:
    lines = []
    if "serving_adapter" in s.model_fields_set:
        lines += ["", f"Inference server adapter: {s.serving_adapter or 'none (base model)'}"]
        if s.serving_note:
            lines.append(f"  {s.serving_note}")
    for name, p in (s.published or {}).items():
        lines.append(f"Served by name {name}: {p.state.upper()}"
                     + (f" ({p.adapter} on {p.endpoint})" if p.adapter else "")
                     + f" — {p.message}")
    for bucket, t in (s.training or {}).items():
        if t.state != "done":
            lines.append(f"Training {bucket}: {t.state.upper()} — {t.message}")
            continue
        verdict = ("reused (same data and parameters)" if t.reused else
                   "PROMOTED" if t.promoted else "kept, not promoted")
        lines.append(f"Training {bucket}: {t.name} — {t.step}/{t.steps} steps, "
                     f"held-out loss {t.eval_loss}, verified {t.verified}, {verdict}")
        if t.gate and not t.reused:
            lines.append(f"  gate: {t.gate}")
    return lines


def cost_summary(usage: NodeUsage | None, s: RunSummary) -> CostSummary:
    """The run's cost block: GPU-hours and estimated USD from the node's RUNNING time
    (compute.usage(): one L4 per node, so GPU-hours = node hours) and the tokens in/out."""
    x = _extraction(s)
    if usage is None:
        return CostSummary(tokens_in=x.prompt_tokens, tokens_out=x.completion_tokens,
                           gpu_hours=None, estimated_usd=None,
                           note="node usage unavailable (see the run log)")
    rates = sorted({(z.provisioning, z.usd_per_hour) for z in usage.zones.values()})
    return CostSummary(tokens_in=x.prompt_tokens, tokens_out=x.completion_tokens,
                       gpu_hours=usage.gpu_hours, running_seconds=usage.running_seconds,
                       estimated_usd=usage.estimated_usd,
                       rates=[f"{p} ${r:.2f}/h" for p, r in rates], zones=usage.zones,
                       note=usage.note)


def _cost_line(c: CostSummary) -> str:
    if c.gpu_hours is None:
        return f"Cost: unknown ({c.note}); tokens in {c.tokens_in} / out {c.tokens_out}"
    rates = f" at {', '.join(c.rates)}" if c.rates else ""
    return (f"Cost: {c.gpu_hours:.4f} GPU-hours{rates} ≈ ${c.estimated_usd or 0.0:.4f}; tokens in "
            f"{c.tokens_in} / out {c.tokens_out}" + (f" ({c.note})" if c.note else ""))


def _about(tokens: int) -> str:
    return (f"~{tokens}" if tokens < 1000 else f"~{tokens / 1e3:.1f} k" if tokens < 999_950
            else f"~{tokens / 1e6:.1f} M")


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def capacity_lines(c: CapacityReport) -> list[str]:
    """Tonight's rates, then the backlog and what clears it (tasks/extraction/capacity.py)."""
    budget = ("" if c.phase1_budget_seconds is None else
              f" of a {c.phase1_budget_seconds:,.0f} s budget")
    rates = (f"Capacity: {c.documents_per_hour:,.1f} documents/h, {c.output_tokens_per_hour:,} "
             f"output tokens/h on {_plural(c.nodes, 'node')} (phase 1 extracting "
             f"{c.phase1_seconds:,.0f} s{budget})")
    if not c.backlog_documents:
        return [rates, "  backlog: none"]
    out = ("" if c.backlog_output_tokens is None else
           f", {_about(c.backlog_output_tokens)} out")
    backlog = (f"  backlog {_plural(c.backlog_documents, 'document')} "
               f"({_about(c.backlog_tokens)} tokens in{out})")
    if c.nights_to_clear is None or c.nodes_to_clear_in_one_night is None:
        return [rates, f"{backlog} · {c.note}"]
    return [rates, f"{backlog} · {_plural(c.nights_to_clear, 'night')} at tonight's rate, or "
            f"{_plural(c.nodes_to_clear_in_one_night, 'node')} for one night"
            + (f" ({c.note})" if c.note else "")]


def quality_lines(q: AnswerQuality | None) -> list[str]:
    """The answers' quality with no gold: grounded precision, and what the schema pruned."""
    if q is None or not (q.grounded_names + q.ungrounded_names or q.pruned_relationships
                         or q.reversed_relationships or q.aliases_resolved):
        return []
    total = q.grounded_names + q.ungrounded_names
    line = (f"Grounded precision: {q.grounded_precision:.2f} ({q.grounded_names} of {total} "
            "names the model wrote occur in their chunk)" if total else
            "Grounded precision: none (the model wrote no names)")
    out = [line]
    fixes = [f"{sum(q.dropped_ungrounded.values())} ungrounded names dropped",
             f"{sum(q.pruned_relationships.values())} relationships pruned (no pattern)"]
    if q.reversed_relationships:
        fixes.append(f"{sum(q.reversed_relationships.values())} turned around")
    if q.aliases_resolved:
        fixes.append(f"{q.aliases_resolved} surnames joined to a full name")
    out.append("  " + ", ".join(fixes))
    return out


def namesake_lines(x: ExtractionReport) -> list[str]:
    """Resolution's night: the joins written by their evidence (`graph merges` lists them),
    contacts kept apart from a namesake, and names alone whose name several Persons hold,
    linked by their document's context or to none and listed with the Persons they could be."""
    if not (x.joins or x.namesakes_apart or x.namesakes_linked or x.unlinked_people):
        return []
    joins = ", ".join(f"{n} by {kind}" for kind, n in sorted(x.joins.items()))
    out = [f"Resolution: {_plural(sum(x.joins.values()), 'join')}"
           + (f" ({joins})" if joins else "") + f", {x.namesakes_apart} contacts kept apart from "
           f"a namesake, {x.namesakes_linked} names alone linked by their document, "
           f"{len(x.unlinked_people)} linked to none (their document fits several or none)"]
    for u in x.unlinked_people[:10]:
        out.append(f"  {u.document}: {u.name} — one of {', '.join(u.candidates)}; "
                   f"{_plural(u.relationships, 'fact')} not written"
                   + (f"; the judge: {u.judge[:160]}" if u.judge else ""))
    if len(x.unlinked_people) > 10:
        out.append(f"  … {len(x.unlinked_people) - 10} more (the run summary's unlinked_people)")
    return out


def render_text(s: RunSummary, profile_ref: str = "local") -> str:
    lines = [f"slm-nightly run — profile {s.profile}: {s.status.upper()}", ""]
    lines.append("Phases:")
    for name, p in s.phases.items():
        note = f"  ({p.note})" if p.note else ""
        lines.append(f"  {name:<15} {p.status:<10} {p.seconds:>8.1f} s{note}")
    if s.error:
        lines += ["", f"Error: {s.error}"]
    card = s.scorecard
    if card:
        lines += ["", f"Corpus scorecard (floor {card.floor} clean pairs): {card.scorecard}"]
        for name, b in card.buckets.items():
            why = "" if b.passed else " — " + "; ".join(b.reasons)
            lines.append(f"  {name:<26}{'PASS' if b.passed else 'FAIL'}  {b.clean} clean of "
                         f"{b.total}{why}")
        if card.training_pending:
            lines.append(f"  training-pending markers: {', '.join(card.training_pending)}")
        sync = card.gcs_sync
        if sync:
            lines.append(f"  GCS sync gs://{sync.bucket}/{sync.prefix}: " + (
                f"FAILED ({sync.error}); local corpus kept" if sync.error else
                f"{sync.uploaded} uploaded, {sync.unchanged} unchanged"))
    lines += _training_lines(s)
    x = _extraction(s)
    if x.documents:
        lines += ["", "Documents      seen  extracted  skipped  failed"]
        for stream, c in x.documents.items():
            lines.append(f"  {stream:<12}{c.seen:>5}{c.extracted:>11}{c.skipped:>9}{c.failed:>8}")
    if x.pending:
        lines.append(f"  pending: {_pending(x.pending)}")
    lines += ["", f"LLM calls: {x.llm_calls}  (prompt tokens {x.prompt_tokens}, "
              f"completion tokens {x.completion_tokens})",
              f"Upserted: {x.entities} entities, {x.relationships} relationships"]
    lines += quality_lines(x.quality)
    lines += namesake_lines(x)
    if s.capacity:
        lines += capacity_lines(s.capacity)
    if s.cost:
        lines.append(_cost_line(s.cost))
    if s.reaper and s.reaper.action == "stopped":
        lines.append(f"Reaper at start: stopped a node left up ({s.reaper.found})")
    for r in s.reconciled or []:
        lines.append(f"Adapter {r.name}: {r.was} → {r.now} at start ({r.reason})")
    lines += _stale_lines(s)
    if x.failures:
        lines += ["", f"Failed documents ({len(x.failures)}), also in {x.dead_letter}:"]
        for f in x.failures[:20]:
            lines.append(f"  {f.id}: {f.message}")
        if len(x.failures) > 20:
            lines.append(f"  … {len(x.failures) - 20} more")
    g = x.graph
    if g:
        nodes = ", ".join(f"{k} {v}" for k, v in g.nodes.items())
        rels = ", ".join(f"{k} {v}" for k, v in g.relationships.items())
        lines += ["", f"Graph: {g.description}", f"  nodes: {nodes or 'none'}",
                  f"  relationships: {rels or 'none'}"]
        if g.check:
            lines.append(f"  check at start: {g.check}")
        lines += _snapshot_lines(g.snapshot, profile_ref)
        lines += [f"  query it: slm-nightly graph stats --profile {profile_ref}",
                  f"            slm-nightly graph query --profile {profile_ref} "
                  "\"MATCH (p:Person)-[:MENTIONED_IN]->(d:Document) RETURN p.name, d.id LIMIT 10\""]
    return "\n".join(lines)


def _pending(pending: dict[str, int]) -> str:
    by = ", ".join(f"{n} {stream}" for stream, n in pending.items())
    return (f"{sum(pending.values())} documents ({by}) the phase-1 budget did not reach; "
            "not failed, first on the next run")


def _snapshot_lines(snap: GraphSnapshot | SnapshotFailed | None, profile_ref: str) -> list[str]:
    if not snap:
        return []
    if isinstance(snap, SnapshotFailed):
        return [f"  snapshot: NOT taken ({snap.error})"]
    where = snap.gcs or snap.path
    lines = [f"  snapshot: {snap.name}" + (" (unchanged since)" if snap.reused else "")
             + f" in {where}"]
    if snap.gcs_error:
        lines.append(f"  snapshot NOT copied to GCS: {snap.gcs_error}")
    lines.append(f"  restore it: slm-nightly graph restore {snap.name} --profile {profile_ref}")
    return lines


def render_markdown(s: RunSummary) -> str:
    lines = [f"# Nightly run: {s.status}", "", "| phase | status | seconds | note |",
             "|---|---|---:|---|"]
    for name, p in s.phases.items():
        lines.append(f"| {name} | {p.status} | {p.seconds:.1f} | {p.note or ''} |")
    x = _extraction(s)
    lines += ["", f"LLM calls {x.llm_calls}, tokens in {x.prompt_tokens} / out "
              f"{x.completion_tokens}; entities {x.entities}, relationships "
              f"{x.relationships}; failed documents {len(x.failures)}."]
    quality = quality_lines(x.quality)
    if quality:
        lines += ["", " · ".join(q.strip() for q in quality)]
    namesakes = namesake_lines(x)
    if namesakes:
        lines += ["", namesakes[0] + "."] + [f"- {u.strip()}" for u in namesakes[1:]]
    if x.pending:
        lines += ["", f"Pending: {_pending(x.pending)}."]
    train = _training_lines(s)
    if train:
        lines += ["", "## Training", ""] + [f"- {x.strip()}" for x in train if x.strip()]
    if s.capacity:
        lines += ["", " · ".join(x.strip() for x in capacity_lines(s.capacity))]
    if s.cost:
        lines += ["", _cost_line(s.cost)]
    if s.reaper and s.reaper.action == "stopped":
        lines += ["", f"Reaper at start: stopped a node left up ({s.reaper.found})."]
    for r in s.reconciled or []:
        lines += ["", f"Adapter {r.name}: {r.was} → {r.now} at start ({r.reason})."]
    for line in _stale_lines(s):
        lines += ["", line + "."]
    if s.error:
        lines += ["", f"**Error:** {s.error}"]
    return "\n".join(lines)


def _stale_lines(s: RunSummary) -> list[str]:
    """The node runs cancelled at the start (tasks/compute/stale_runs.py), or why none were."""
    return [f"Stale node runs not checked: {r.error}" if r.error is not None else
            f"Node run {r.name} ({r.was}) cancelled at start: {r.reason}"
            for r in s.stale_node_runs or []]
