"""The eval's figures as the terminal shows them."""

from __future__ import annotations

from typing import Any


def _pct(v: float | None) -> str:
    return "  n/a" if v is None else f"{v:5.3f}"


def _prf_line(label: str, f: dict[str, Any]) -> str:
    return (f"  {label:<26} P {_pct(f['precision'])}  R {_pct(f['recall'])}  "
            f"F1 {_pct(f['f1'])}   ({f['correct']}/{f['predictions']} predictions correct in "
            f"{f['precision_cases']} complete case(s); {f['found']}/{f['gold']} gold found in "
            f"{f['recall_cases']} case(s))")


def render_figures(title: str, f: dict[str, Any]) -> list[str]:
    g, res = f["grounded"], f["resolution"]
    return [
        f"{title}: {f['cases']} case(s), {f['complete_cases']} complete, "
        f"{f['failed_cases']} failed",
        _prf_line("entities, type-agnostic", f["entities"]["type_agnostic"]),
        _prf_line("entities, type-strict", f["entities"]["type_strict"]),
        _prf_line("relationship triples", f["relationships"]),
        f"  {'grounded precision':<26} {_pct(g['precision'])}   ({g['grounded']} of "
        f"{g['grounded'] + g['ungrounded']} names written occur in their chunk)",
        f"  {'over-split':<26} {res['over_split']} of {res['matched_gold']} gold entities found "
        f"(rate {_pct(res['over_split_rate'])})",
        f"  {'over-merge':<26} {res['over_merge']} of {res['matched_keys']} matching keys "
        f"(rate {_pct(res['over_merge_rate'])})",
    ]


def render(result: dict[str, Any]) -> str:
    e = result["engine"]
    lines = [f"extraction eval, split {result['split']}: model {result['model']} "
             f"({e['dialect']} at {e['base_url']}{', started for this run' if e['started_here'] else ''}), "
             f"profile {result['profile']}, schema {result['schema']['digest'][:12]}, prompt "
             f"{result['prompt_digest'][:12]}, gleanings {result['gleanings']}, "
             f"{result['seconds']:.1f} s"]
    if result.get("note"):
        lines.append(f"NOTE: {result['note']}")
    lines.append("")
    lines += render_figures("all cases", result["figures"])
    if len(result["splits"]) > 1:
        for name, f in result["splits"].items():
            lines += [""] + render_figures(f"split {name}", f)
    u = result["unusable_answers"]
    lines += ["", f"unusable answers: {u['total']}" + (
        f" ({', '.join(f'{k}: {v}' for k, v in sorted(u['by_reason'].items()))})"
        if u["by_reason"] else "")]
    for fail in result["failed"]:
        lines.append(f"failed case {fail['id']}: {fail['error']}: {fail['message']}")
    if result.get("cases_split_into_chunks"):
        lines.append(f"cases longer than one chunk ({result['chunk_tokens']} tokens): "
                     f"{', '.join(result['cases_split_into_chunks'])}")
    return "\n".join(lines)


def render_gate(rows: list[dict[str, Any]], tolerance: float, baseline: str) -> str:
    def num(v: float | None) -> str:
        return "null" if v is None else f"{v:.3f}"

    lines = [f"gate against {baseline} (tolerance {tolerance:.3f} absolute):"]
    for r in rows:
        change = "" if r["change"] is None else f" ({r['change']:+.3f})"
        verdict = "ok" if r["passed"] else f"DROPPED by more than {tolerance:.3f}"
        lines.append(f"  {r['figure']:<30} {num(r['old'])} → {num(r['new'])}{change}  {verdict}")
    return "\n".join(lines)
