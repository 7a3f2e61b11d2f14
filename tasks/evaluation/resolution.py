"""`slm-nightly eval resolution`: phase 1's entity resolution against known identities.

The gold set (evals/resolution/<set>/, made by evals/resolution/make_gold.py) is documents
phase 1 writes without the model — contact files and transcripts — and `truth.json`: the true
identity of each person mention (a contact record, "DOC#i"; a transcript's participant label,
"DOC@LABEL") and of each contact's organization ("DOC#i"). The eval loads them with phase 1's
loaders and writes them into a scratch graph on an embedded FalkorDB, one document a batch, as
phase 1 does (tasks/extraction/batch.py resolved_batch, then upsert). Then it reads back the
entity each mention became — a record's Person by its address (by its phone, or by its spelling
among its document's Persons, where it has no address), a participant's by the document's
mentions (its name's Person or a namesake of it; none when it was linked to no one, a cluster
of its own), an organization by its key — and scores the clusters against the truth: pairwise
and B-cubed precision and recall (Bagga and Baldwin 1998) for people and for organizations, and
the namesakes merged (two identities of one name in one entity). The gate: every precision ≥
PRECISION, every recall ≥ RECALL, no namesake merged.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping
from itertools import combinations
from pathlib import Path
from typing import Any

from tasks.extraction.answers import BatchReport
from tasks.extraction.batch import resolved_batch
from tasks.extraction.calls import DocOutcome
from tasks.extraction.documents import Document, scan
from tasks.extraction.rows import entity
from tasks.graph import falkordb_server
from tasks.graph.falkordb_store import FalkorDBStore
from tasks.shared.errors import ConfigError

GOLD = Path(__file__).resolve().parents[2] / "evals" / "resolution"
PRECISION, RECALL = 0.98, 0.95
MAX_BYTES = 5_000_000


def pairwise(pred: Mapping[str, Hashable], truth: Mapping[str, Hashable]) -> tuple[float, float]:
    """Precision and recall of the pairs of mentions put together (1.0 where there is no pair
    to judge)."""
    same_pred = {(a, b) for a, b in combinations(sorted(truth), 2) if pred[a] == pred[b]}
    same_true = {(a, b) for a, b in combinations(sorted(truth), 2) if truth[a] == truth[b]}
    right = len(same_pred & same_true)
    return (right / len(same_pred) if same_pred else 1.0,
            right / len(same_true) if same_true else 1.0)


def bcubed(pred: Mapping[str, Hashable], truth: Mapping[str, Hashable]) -> tuple[float, float]:
    """B-cubed precision and recall: each mention's share of its predicted cluster that is
    truly its, and of its true cluster that was predicted with it, averaged over mentions (1.0
    where there is no mention, as `pairwise` where there is no pair)."""
    by_pred, by_true = defaultdict(set), defaultdict(set)
    for m in truth:
        by_pred[pred[m]].add(m)
        by_true[truth[m]].add(m)
    p = r = 0.0
    for m in truth:
        both = len(by_pred[pred[m]] & by_true[truth[m]])
        p += both / len(by_pred[pred[m]])
        r += both / len(by_true[truth[m]])
    if not truth:
        return 1.0, 1.0
    return p / len(truth), r / len(truth)


def _load(gold: Path) -> tuple[list[Document], dict[str, dict[str, str]]]:
    truth_file = gold / "truth.json"
    if not truth_file.is_file():
        raise ConfigError(f"eval resolution: {truth_file} is missing — give a gold set folder "
                          f"(its contacts/, transcripts/ and truth.json), e.g. {GOLD / 'dev'}")
    truth = json.loads(truth_file.read_text())
    roots = {s: gold / s for s in ("contacts", "transcripts") if (gold / s).is_dir()}
    docs, failures = scan(roots, MAX_BYTES)
    if failures:
        raise ConfigError(f"eval resolution: {gold}: documents that do not load: "
                          + "; ".join(f"{f.id}: {f.reason}" for f in failures))
    return docs, truth


def _write(docs: list[Document], store: FalkorDBStore) -> int:
    """Each document into the graph as phase 1 writes it; the names linked to no one."""
    unlinked = 0
    for doc in docs:
        report = BatchReport()
        store.upsert(resolved_batch([DocOutcome(doc, [])], store, "eval", report))
        unlinked += len(report.unlinked)
    return unlinked


def _predicted(docs: list[Document], store: FalkorDBStore,
               truth: dict[str, dict[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    """The entity key each mention of the truth became (its own id where none)."""
    records = {f"{d.id}#{i}": r for d in docs for i, r in enumerate(d.records)}
    people: dict[str, str] = {}
    for m in truth["people"]:
        if "#" in m and records[m]["emails"]:
            email = records[m]["emails"][0]
            people[m] = store.keys_by_email([email]).get(email, m)
        elif "#" in m and records[m]["phones"]:  # a phone alone: the Person holding it
            found = store.query("MATCH (p:Person) WHERE $phone IN p.phones RETURN p.key AS k",
                                {"phone": records[m]["phones"][0]})
            people[m] = found[0]["k"] if len(found) == 1 else m
        elif "#" in m:  # a name alone: the Person of its document holding that spelling
            name = entity("Person", records[m]["name"]).name
            found = store.query("MATCH (p:Person)-[:MENTIONED_IN]->(:Document {id: $doc}) "
                                "WHERE p.name = $name OR $name IN p.aliases "
                                "RETURN p.key AS k", {"doc": m.partition("#")[0], "name": name})
            people[m] = found[0]["k"] if len(found) == 1 else m
        else:
            doc, _, label = m.partition("@")
            key = entity("Person", label).key
            found = store.query("MATCH (p:Person)-[:MENTIONED_IN]->(:Document {id: $doc}) "
                                "WHERE p.key = $key OR p.namesake_of = $key RETURN p.key AS k "
                                "ORDER BY k", {"doc": doc, "key": key})
            people[m] = found[0]["k"] if len(found) == 1 else m
    orgs = {m: entity("Organization", records[m]["organization"]).key
            for m in truth["organizations"]}
    return people, orgs


def _namesakes_merged(pred: dict[str, str], truth: dict[str, str]) -> int:
    """Entities that hold mentions of more than one true identity sharing one name."""
    ids_of: dict[str, set[str]] = defaultdict(set)
    for m, key in pred.items():
        ids_of[key].add(truth[m])
    return sum(1 for ids in ids_of.values() if len(ids) > 1)


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr)


def evaluate(gold: Path, say: Callable[[str], None] = _to_stderr) -> dict[str, Any]:
    """Run the gold set through resolution on a scratch embedded FalkorDB; the figures (progress
    to stderr, so stdout stays the figures)."""
    docs, truth = _load(gold)
    data = Path(tempfile.mkdtemp(prefix="eval-resolution-"))
    server, _ = falkordb_server.start(data)
    try:
        store = FalkorDBStore("127.0.0.1", server.port, "eval_resolution")
        store.ensure_schema()
        say(f"eval resolution: {len(docs)} documents of {gold} into a scratch graph")
        unlinked = _write(docs, store)
        people, orgs = _predicted(docs, store, truth)
        store.close()
    finally:
        falkordb_server.stop(data)
        shutil.rmtree(data, ignore_errors=True)
    out: dict[str, Any] = {"gold": str(gold), "documents": len(docs), "unlinked": unlinked}
    for kind, pred in (("people", people), ("organizations", orgs)):
        t = truth[kind]
        (pp, pr), (bp, br) = pairwise(pred, t), bcubed(pred, t)
        out[kind] = {"mentions": len(t), "identities": len(set(t.values())),
                     "entities": len(set(pred.values())), "pairwise_precision": round(pp, 4),
                     "pairwise_recall": round(pr, 4), "bcubed_precision": round(bp, 4),
                     "bcubed_recall": round(br, 4)}
    out["people"]["namesakes_merged"] = _namesakes_merged(people, truth["people"])
    return out


def gate(result: dict[str, Any]) -> list[str]:
    """What falls short of the gate (empty: passed)."""
    short = []
    for kind in ("people", "organizations"):
        for fig, floor in (("pairwise_precision", PRECISION), ("bcubed_precision", PRECISION),
                           ("pairwise_recall", RECALL), ("bcubed_recall", RECALL)):
            if result[kind][fig] < floor:
                short.append(f"{kind} {fig} {result[kind][fig]:.3f} < {floor}")
    if result["people"]["namesakes_merged"]:
        short.append(f"{result['people']['namesakes_merged']} entities hold namesakes")
    return short


def render(result: dict[str, Any]) -> str:
    lines = [f"resolution eval: {result['gold']} ({result['documents']} documents; "
             f"{result['unlinked']} names alone linked to no one)"]
    for kind in ("people", "organizations"):
        r = result[kind]
        lines.append(f"  {kind:<14} {r['mentions']} mentions of {r['identities']} identities → "
                     f"{r['entities']} entities; pairwise P {r['pairwise_precision']:.3f} "
                     f"R {r['pairwise_recall']:.3f}; B-cubed P {r['bcubed_precision']:.3f} "
                     f"R {r['bcubed_recall']:.3f}")
    lines.append(f"  namesakes merged: {result['people']['namesakes_merged']}")
    return "\n".join(lines)
