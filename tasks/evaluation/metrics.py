"""Scoring resolved predictions against the gold: pure functions, no I/O.

Entities match by name: a prediction matches a gold entity when one of its written forms (the
resolved name and every alias) equals one of the gold's (its name and aliases), each
normalised as the resolver does (tasks/extraction/resolve.py: honorifics off, case, accents and
whitespace ignored). Type-agnostic ignores the type; type-strict needs it equal too. A
relationship triple is correct when its type is the gold's and both ends match the gold's
source and target entities (direction counts).

Precision rests on `complete` cases only (a recall-only case cannot call a prediction wrong);
recall on every case; both micro-averaged over the cases' items. A figure with nothing to rest
on is None (null in the JSON), never 0 or 1. Matches are many-to-many: two predicted keys for
one gold entity are both correct, and the split shows in `over_split` instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tasks.evaluation.gold import GoldCase
from tasks.extraction.resolve import normalize, split_name


@dataclass(frozen=True)
class PredictedEntity:
    key: str  # the resolver's key: one node of the graph
    type: str
    names: tuple[str, ...]  # the resolved name and every alias written


@dataclass
class CasePrediction:
    """What the pipeline made of one case: its resolved batch, the grounding counts, or why
    it failed."""

    case_id: str
    entities: list[PredictedEntity] = field(default_factory=list)
    relationships: list[tuple[str, str, str]] = field(default_factory=list)  # (src, TYPE, dst)
    grounded: int = 0  # names written that occur in the chunk's text
    ungrounded: int = 0
    error: str | None = None  # the case failed (LLMError): no prediction
    error_type: str | None = None


def forms(name: str) -> set[str]:
    """The normalised forms of one written name: as written, and with honorifics and
    post-nominals off (the resolver's person form)."""
    return {f for f in (normalize(name), normalize(split_name(name).name)) if f}


@dataclass
class CaseScore:
    case_id: str
    split: str
    complete: bool
    counts: Counter[str]  # see score_case
    gold_kinds: Counter[str]  # "entity:speaker" → gold items; "found:entity:speaker" → found
    missed: list[str]
    wrong: list[str]  # predictions a complete case's gold does not know (type-strict)
    error: str | None = None
    error_type: str | None = None


def score_case(case: GoldCase, pred: CasePrediction) -> CaseScore:
    """The case's counts: predicted entities/relationships and how many are correct (each
    counted for precision only when the case is complete), gold items and how many were found,
    over-split gold entities and over-merged keys, grounded and ungrounded names."""
    c: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    gold_forms = {g.id: set().union(*(forms(n) for n in (g.name, *g.aliases))) for g in case.entities}
    gold_type = {g.id: g.type for g in case.entities}
    agnostic: dict[str, set[str]] = {}  # predicted key → gold ids it matches by name
    strict: dict[str, set[str]] = {}
    for p in pred.entities:
        mine = set().union(*(forms(n) for n in p.names)) if p.names else set()
        agnostic[p.key] = {g for g, fs in gold_forms.items() if fs & mine}
        strict[p.key] = {g for g in agnostic[p.key] if gold_type[g] == p.type}
    gold_rels = {(r.source, r.type, r.target) for r in case.relationships}
    found_rels = set()
    correct_rels = 0
    for src, rtype, dst in pred.relationships:
        hits = {(s, rtype, d) for s in agnostic.get(src, ()) for d in agnostic.get(dst, ())
                } & gold_rels
        found_rels |= hits
        correct_rels += bool(hits)
    missed: list[str] = []
    wrong: list[str] = []
    if case.complete:
        c["entity_predictions"] = len(pred.entities)
        c["entity_correct_agnostic"] = sum(bool(v) for v in agnostic.values())
        c["entity_correct_strict"] = sum(bool(v) for v in strict.values())
        c["relationship_predictions"] = len(pred.relationships)
        c["relationship_correct"] = correct_rels
        c["precision_cases"] = 1
        wrong = [f"{p.type} {p.names[0] if p.names else p.key}" for p in pred.entities
                 if not strict[p.key]]
        wrong += [f"{s} {t} {d}" for s, t, d in pred.relationships
                  if not {(a, t, b) for a in agnostic.get(s, ()) for b in agnostic.get(d, ())}
                  & gold_rels]
    found_agnostic = set().union(*agnostic.values()) if agnostic else set()
    found_strict = set().union(*strict.values()) if strict else set()
    c["entity_gold"] = len(case.entities)
    c["entity_found_agnostic"] = len(found_agnostic)
    c["entity_found_strict"] = len(found_strict)
    c["relationship_gold"] = len(gold_rels)
    c["relationship_found"] = len(found_rels)
    c["recall_cases"] = 1
    keys_per_gold = Counter(g for gs in agnostic.values() for g in gs)
    c["over_split"] = sum(n > 1 for n in keys_per_gold.values())
    c["matched_gold"] = len(keys_per_gold)
    c["over_merge"] = sum(len(gs) > 1 for gs in agnostic.values())
    c["matched_keys"] = sum(bool(gs) for gs in agnostic.values())
    c["grounded"], c["ungrounded"] = pred.grounded, pred.ungrounded
    c["failed"] = int(pred.error is not None)
    for g in case.entities:
        kinds[f"entity:{g.kind or g.type}"] += 1
        if g.id in found_strict:
            kinds[f"found:entity:{g.kind or g.type}"] += 1
        else:
            missed.append(f"{g.type} {g.name}")
    names = {g.id: g.name for g in case.entities}
    for r in case.relationships:
        kinds[f"relationship:{r.kind or r.type}"] += 1
        if (r.source, r.type, r.target) in found_rels:
            kinds[f"found:relationship:{r.kind or r.type}"] += 1
        else:
            missed.append(f"{names[r.source]} {r.type} {names[r.target]}")
    return CaseScore(case.id, case.split, case.complete, c, kinds, missed, wrong, pred.error,
                     pred.error_type)


def ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def f1(p: float | None, r: float | None) -> float | None:
    """Harmonic mean; 0 when either is 0 (nothing right), None when either has nothing to rest
    on."""
    if p == 0 or r == 0:
        return 0.0
    if p is None or r is None:
        return None
    return 2 * p * r / (p + r)


def _prf(c: Counter[str], correct: str, predictions: str, found: str, gold: str
         ) -> dict[str, Any]:
    p, r = ratio(c[correct], c[predictions]), ratio(c[found], c[gold])
    return {"precision": p, "recall": r, "f1": f1(p, r),
            "correct": c[correct], "predictions": c[predictions], "found": c[found],
            "gold": c[gold], "precision_cases": c["precision_cases"],
            "recall_cases": c["recall_cases"]}


def figures(scores: list[CaseScore]) -> dict[str, Any]:
    """Every figure over `scores` (one split, or all of them)."""
    c: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for s in scores:
        c.update(s.counts)
        kinds.update(s.gold_kinds)
    names = c["grounded"] + c["ungrounded"]
    by_kind = {k: {"gold": n, "found": kinds[f"found:{k}"],
                   "recall": ratio(kinds[f"found:{k}"], n)}
               for k, n in sorted(kinds.items()) if not k.startswith("found:")}
    return {
        "cases": len(scores),
        "complete_cases": c["precision_cases"],
        "entities": {
            "type_agnostic": _prf(c, "entity_correct_agnostic", "entity_predictions",
                                  "entity_found_agnostic", "entity_gold"),
            "type_strict": _prf(c, "entity_correct_strict", "entity_predictions",
                                "entity_found_strict", "entity_gold"),
        },
        "relationships": _prf(c, "relationship_correct", "relationship_predictions",
                              "relationship_found", "relationship_gold"),
        "grounded": {"precision": ratio(c["grounded"], names), "grounded": c["grounded"],
                     "ungrounded": c["ungrounded"]},
        "resolution": {"over_split": c["over_split"],
                       "over_split_rate": ratio(c["over_split"], c["matched_gold"]),
                       "matched_gold": c["matched_gold"],
                       "over_merge": c["over_merge"],
                       "over_merge_rate": ratio(c["over_merge"], c["matched_keys"]),
                       "matched_keys": c["matched_keys"]},
        "recall_by_kind": by_kind,  # type-strict for entities
        "failed_cases": c["failed"],
    }


def score(cases: list[GoldCase], preds: dict[str, CasePrediction]
          ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[CaseScore]]:
    """Overall figures, figures per split present, and each case's score. A case with no
    prediction counts as a failed one."""
    scores = [score_case(case, preds.get(case.id) or CasePrediction(case.id, error="no answer",
                                                                    error_type="Missing"))
              for case in cases]
    splits = sorted({s.split for s in scores})
    return (figures(scores), {sp: figures([s for s in scores if s.split == sp]) for sp in splits},
            scores)

