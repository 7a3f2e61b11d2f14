"""The run summary: one dict, printed for people, written as JSON, published as an artifact."""

from __future__ import annotations

from typing import Any


def new_summary(profile: str) -> dict[str, Any]:
    return {
        "profile": profile,
        "status": "running",
        "documents": {},
        "llm_calls": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "entities": 0,
        "relationships": 0,
        "failures": [],
        "phases": {},
        "graph": {},
    }


def merge_extraction(summary: dict[str, Any], phase1: dict[str, Any]) -> None:
    for key in ("documents", "llm_calls", "prompt_tokens", "completion_tokens", "entities",
                "relationships", "failures", "graph", "dead_letter", "deleted", "pruned",
                "rejected_entity_types", "remapped_relationship_types", "unusable_answers",
                "dropped_fields", "bad_records"):
        if key in phase1:
            summary[key] = phase1[key]


def _training_lines(s: dict[str, Any]) -> list[str]:
    lines = []
    if "serving_adapter" in s:
        lines += ["", f"Inference server adapter: {s['serving_adapter'] or 'none (base model)'}"]
    for bucket, t in (s.get("training") or {}).items():
        if t.get("state") != "done":
            lines.append(f"Training {bucket}: {t.get('state', '?').upper()} — {t.get('message')}")
            continue
        verdict = ("reused (same data and parameters)" if t.get("reused") else
                   "PROMOTED" if t.get("promoted") else "kept, not promoted")
        loss = t.get("eval_loss")
        lines.append(f"Training {bucket}: {t['name']} — {t['step']}/{t['steps']} steps, "
                     f"held-out loss {loss}, verified {t.get('verified')}, {verdict}")
        if t.get("gate") and not t.get("reused"):
            lines.append(f"  gate: {t['gate']}")
    return lines


def cost_summary(usage: dict[str, Any] | None, s: dict[str, Any]) -> dict[str, Any]:
    """The run's cost block: GPU-hours and estimated USD from the node's RUNNING time
    (compute.usage(): one L4 per node, so GPU-hours = node hours) and the tokens in/out."""
    cost: dict[str, Any] = {"tokens_in": s.get("prompt_tokens", 0),
                            "tokens_out": s.get("completion_tokens", 0)}
    if usage is None:
        return {**cost, "gpu_hours": None, "estimated_usd": None,
                "note": "node usage unavailable (see the run log)"}
    rates = sorted({(z["provisioning"], z["usd_per_hour"]) for z in usage.get("zones", {}).values()})
    return {**cost, "gpu_hours": usage["gpu_hours"], "running_seconds": usage["running_seconds"],
            "estimated_usd": usage["estimated_usd"],
            "rates": [f"{p} ${r:.2f}/h" for p, r in rates], "zones": usage.get("zones", {}),
            "note": usage.get("note", "")}


def _cost_line(c: dict[str, Any]) -> str:
    if c.get("gpu_hours") is None:
        return f"Cost: unknown ({c.get('note')}); tokens in {c['tokens_in']} / out {c['tokens_out']}"
    rates = f" at {', '.join(c['rates'])}" if c.get("rates") else ""
    return (f"Cost: {c['gpu_hours']:.4f} GPU-hours{rates} ≈ ${c['estimated_usd']:.4f}; tokens in "
            f"{c['tokens_in']} / out {c['tokens_out']}" + (f" ({c['note']})" if c.get("note")
                                                            else ""))


def render_text(s: dict[str, Any], profile_ref: str = "local") -> str:
    lines = [f"slm-nightly run — profile {s['profile']}: {s['status'].upper()}", ""]
    lines.append("Phases:")
    for name, p in s["phases"].items():
        note = f"  ({p['note']})" if p.get("note") else ""
        lines.append(f"  {name:<15} {p['status']:<10} {p['seconds']:>8.1f} s{note}")
    if s.get("error"):
        lines += ["", f"Error: {s['error']}"]
    card = s.get("scorecard")
    if card:
        lines += ["", f"Corpus scorecard (floor {card['floor']} clean pairs): {card['scorecard']}"]
        for name, b in card["buckets"].items():
            why = "" if b["passed"] else " — " + "; ".join(b["reasons"])
            lines.append(f"  {name:<26}{'PASS' if b['passed'] else 'FAIL'}  {b['clean']} clean of "
                         f"{b['total']}{why}")
        if card.get("training_pending"):
            lines.append(f"  training-pending markers: {', '.join(card['training_pending'])}")
        sync = card.get("gcs_sync")
        if sync:
            lines.append(f"  GCS sync gs://{sync['bucket']}/{sync['prefix']}: " + (
                f"FAILED ({sync['error']}); local corpus kept" if sync["error"] else
                f"{sync['uploaded']} uploaded, {sync['unchanged']} unchanged"))
    lines += _training_lines(s)
    if s["documents"]:
        lines += ["", "Documents      seen  extracted  skipped  failed"]
        for stream, c in s["documents"].items():
            lines.append(f"  {stream:<12}{c['seen']:>5}{c['extracted']:>11}{c['skipped']:>9}"
                         f"{c['failed']:>8}")
    lines += ["", f"LLM calls: {s['llm_calls']}  (prompt tokens {s['prompt_tokens']}, "
              f"completion tokens {s['completion_tokens']})",
              f"Upserted: {s['entities']} entities, {s['relationships']} relationships"]
    if s.get("cost"):
        lines.append(_cost_line(s["cost"]))
    reaped = s.get("reaper") or {}
    if reaped.get("action") == "stopped":
        lines.append(f"Reaper at start: stopped a node left up ({reaped.get('found')})")
    if s.get("failures"):
        lines += ["", f"Failed documents ({len(s['failures'])}), also in {s.get('dead_letter')}:"]
        for f in s["failures"][:20]:
            lines.append(f"  {f['id']}: {f['message']}")
        if len(s["failures"]) > 20:
            lines.append(f"  … {len(s['failures']) - 20} more")
    g = s.get("graph") or {}
    if g:
        nodes = ", ".join(f"{k} {v}" for k, v in g.get("nodes", {}).items())
        rels = ", ".join(f"{k} {v}" for k, v in g.get("relationships", {}).items())
        lines += ["", f"Graph: {g.get('description')}", f"  nodes: {nodes or 'none'}",
                  f"  relationships: {rels or 'none'}"]
        if g.get("check"):
            lines.append(f"  check at start: {g['check']}")
        lines += _snapshot_lines(g.get("snapshot"), profile_ref)
        lines += [f"  query it: slm-nightly graph stats --profile {profile_ref}",
                  f"            slm-nightly graph query --profile {profile_ref} "
                  "\"MATCH (p:Person)-[:MENTIONED_IN]->(d:Document) RETURN p.name, d.id LIMIT 10\""]
    return "\n".join(lines)


def _snapshot_lines(snap: dict[str, Any] | None, profile_ref: str) -> list[str]:
    if not snap:
        return []
    if snap.get("error"):
        return [f"  snapshot: NOT taken ({snap['error']})"]
    where = snap.get("gcs") or snap.get("path")
    lines = [f"  snapshot: {snap['name']}" + (" (unchanged since)" if snap.get("reused") else "")
             + f" in {where}"]
    if snap.get("gcs_error"):
        lines.append(f"  snapshot NOT copied to GCS: {snap['gcs_error']}")
    lines.append(f"  restore it: slm-nightly graph restore {snap['name']} --profile {profile_ref}")
    return lines


def render_markdown(s: dict[str, Any]) -> str:
    lines = [f"# Nightly run: {s['status']}", "", "| phase | status | seconds | note |",
             "|---|---|---:|---|"]
    for name, p in s["phases"].items():
        lines.append(f"| {name} | {p['status']} | {p['seconds']:.1f} | {p.get('note', '')} |")
    lines += ["", f"LLM calls {s['llm_calls']}, tokens in {s['prompt_tokens']} / out "
              f"{s['completion_tokens']}; entities {s['entities']}, relationships "
              f"{s['relationships']}; failed documents {len(s.get('failures', []))}."]
    train = _training_lines(s)
    if train:
        lines += ["", "## Training", ""] + [f"- {x.strip()}" for x in train if x.strip()]
    if s.get("cost"):
        lines += ["", _cost_line(s["cost"])]
    reaped = s.get("reaper") or {}
    if reaped.get("action") == "stopped":
        lines += ["", f"Reaper at start: stopped a node left up ({reaped.get('found')})."]
    if s.get("error"):
        lines += ["", f"**Error:** {s['error']}"]
    return "\n".join(lines)
