"""The model's answers read into graph rows: labels mapped to the graph schema, names grounded
in their chunk's text, one-word names joined to the document's full name, a name alone linked
to the one namesake its document fits (or to none, and listed), relationships no pattern
allows pruned or turned around, and the deterministic rows (front matter, contact records)
beside them; the batch's counts of all of it (BatchReport)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tasks.extraction import streams
from tasks.extraction.calls import DocOutcome
from tasks.extraction.documents import Document
from tasks.extraction.judge import Candidate, Judge
from tasks.extraction.llm import Usage
from tasks.extraction.prompt import document_version
from tasks.extraction.resolve import normalize, phone_key, phones_in, variant_of
from tasks.extraction.rows import DocRows, Join, entity
from tasks.graph.ontology import GraphSchema, default_schema
from tasks.graph.store import ChunkRow, EntityRow, GraphBatch, RelRow, now_iso
from tasks.records import FailedDocument, UnlinkedMention

UNGROUNDED_SAMPLES = 20  # names listed in the report (the count is whole)


@dataclass
class BatchReport:
    extracted: Counter[str] = field(default_factory=Counter)  # per stream
    failed: list[FailedDocument] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)  # ids: not marked, not dead-lettered
    usage: Usage = field(default_factory=Usage)
    entities: int = 0
    relationships: int = 0
    rejected_entity_types: Counter[str] = field(default_factory=Counter)
    remapped_relationship_types: Counter[str] = field(default_factory=Counter)
    dropped_fields: Counter[str] = field(default_factory=Counter)  # unknown fields, by name
    dangling_relationships: int = 0
    # relationships no pattern allows, by "Source TYPE Target" as written: dropped; and the
    # ones turned around because the reverse is allowed
    pruned_relationships: Counter[str] = field(default_factory=Counter)
    reversed_relationships: Counter[str] = field(default_factory=Counter)
    # names the model wrote that occur (or not) in their chunk's text: grounded precision
    grounded_names: int = 0
    ungrounded_names: int = 0
    ungrounded: list[str] = field(default_factory=list)  # the first UNGROUNDED_SAMPLES
    aliases_resolved: int = 0  # "Mr. Viersen" → the document's one "Arnold Viersen"
    # ungrounded names of a type that requires grounding, dropped, by type
    dropped_ungrounded: Counter[str] = field(default_factory=Counter)
    gleaning_failures: int = 0
    namesakes_linked: int = 0  # a name alone linked to the one namesake its document fits
    namesakes_apart: int = 0  # a contact kept apart from its name's Person (address, employer)
    # the joins written (graph merges lists them), by their evidence's kind: "e-mail" (a
    # contact's address, or one in the text), "employer", "surname"
    joins: Counter[str] = field(default_factory=Counter)
    unlinked: list[UnlinkedMention] = field(default_factory=list)  # … that fits several or none
    write_seconds: float = 0.0  # the graph writes' time (phase 1 keeps it back from its budget)

    def add(self, other: BatchReport) -> None:
        """Fold in another batch's report: the run's totals are one BatchReport."""
        self.extracted.update(other.extracted)
        self.failed.extend(other.failed)
        self.deferred.extend(other.deferred)
        self.usage.add(other.usage)
        self.entities += other.entities
        self.relationships += other.relationships
        self.add_labels(other)

    def add_labels(self, other: BatchReport) -> None:
        """Take over the answer-quality counts of `other` (one write attempt's)."""
        for name in ("rejected_entity_types", "remapped_relationship_types", "dropped_fields",
                     "pruned_relationships", "reversed_relationships", "dropped_ungrounded",
                     "joins"):
            getattr(self, name).update(getattr(other, name))
        for name in ("dangling_relationships", "grounded_names", "ungrounded_names",
                     "aliases_resolved", "gleaning_failures", "namesakes_linked",
                     "namesakes_apart"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.unlinked.extend(other.unlinked)
        self.ungrounded.extend(other.ungrounded[:UNGROUNDED_SAMPLES - len(self.ungrounded)])


_GROUND = re.compile(r"[\W_]+")


def _ground_form(s: str) -> str:
    return f" {_GROUND.sub(' ', normalize(s)).strip()} "


def grounded(name: str, text: str) -> bool:
    """The name occurs in the text as whole words (case, accents, punctuation and spacing
    aside): what grounded precision counts."""
    form = _ground_form(name)
    return form.strip() != "" and form in _ground_form(text)


# name keys ("Person:john smith") → the graph's Persons of each name: the one of that key and
# its namesakes (tasks/extraction/batch.py people_named reads them from the store)
PeopleLookup = Callable[[set[str]], dict[str, list[Candidate]]]


def _nobody(names: set[str]) -> dict[str, list[Candidate]]:
    return {}


# organization keys → the Persons who work for each: person key → name (the graph's;
# tasks/extraction/batch.py colleagues_of reads them from the store)
ColleagueLookup = Callable[[set[str]], dict[str, dict[str, str]]]


def _no_colleagues(orgs: set[str]) -> dict[str, dict[str, str]]:
    return {}


def _deterministic(doc: Document, rows: DocRows, email_keys: dict[str, str],
                   ontology: GraphSchema, report: BatchReport) -> None:
    """The rows the document's stream writes without the model (tasks/extraction/streams.py:
    front matter, contact records), the schema's labels where it has them; none for a stream
    without such rows, or one not registered."""
    stream = streams.find(doc.stream)
    if stream is not None and stream.rows is not None:
        stream.rows(doc, rows, email_keys, ontology, report.pruned_relationships)


def _from_llm(outcome: DocOutcome, rows: DocRows, report: BatchReport,
              ontology: GraphSchema) -> None:
    doc = outcome.doc
    doc_names: dict[str, str] = {}  # a name of any chunk: relationships across chunks resolve
    pending: list[tuple[Any, int, dict[str, str]]] = []
    for ca in outcome.chunks:
        by_name: dict[str, str] = {}
        for ex in ca.answers:
            # labels were mapped (or their items dropped) and unknown fields dropped on the way
            report.rejected_entity_types.update(ex.repairs.rejected_entity_types)
            report.remapped_relationship_types.update(ex.repairs.remapped_relationship_types)
            report.dropped_fields.update(ex.repairs.dropped_fields)
            for ent in ex.entities:
                label = ontology.map_entity_type(ent.type)
                if label is None or not ent.name.strip():
                    report.rejected_entity_types[ent.type or "(empty)"] += 1
                    continue
                if grounded(ent.name, ca.chunk.text):
                    report.grounded_names += 1
                else:
                    report.ungrounded_names += 1
                    if len(report.ungrounded) < UNGROUNDED_SAMPLES:
                        report.ungrounded.append(f"{doc.id}#{ca.chunk.index}: {ent.name[:80]}")
                    if ontology.requires_grounding(label):
                        report.dropped_ungrounded[label] += 1
                        continue
                row = entity(label, ent.name[:200], ent.description[:500])
                own = ontology.property_names(label)
                for k, v in ent.properties.items():
                    if k in own and v.strip():
                        row.properties[k] = v.strip()[:500]
                    elif k not in own:  # another type's property: not this entity's
                        report.dropped_fields[f"entities[].properties.{k}"] += 1
                rows.add(row, ca.chunk.index)
                for n in (ent.name.strip(), row.name):
                    by_name.setdefault(n.casefold(), row.key)
                    doc_names.setdefault(n.casefold(), row.key)
            pending += [(rel, ca.chunk.index, by_name) for rel in ex.relationships]
    for rel, index, by_name in pending:
        src, dst = (by_name.get(n.strip().casefold()) or doc_names.get(n.strip().casefold())
                    for n in (rel.source, rel.target))
        if not src or not dst or src == dst:
            report.dangling_relationships += 1
            continue
        rtype, remapped = ontology.map_relationship_type(rel.type)
        if remapped:
            report.remapped_relationship_types[rel.type] += 1
        s_type, d_type = src.split(":", 1)[0], dst.split(":", 1)[0]
        action, rtype = ontology.prune(s_type, rtype, d_type)
        written = f"{s_type} {rtype} {d_type}"
        if action == "dropped":
            report.pruned_relationships[written] += 1
            continue
        if action == "reversed":
            report.reversed_relationships[written] += 1
            src, dst = dst, src
        elif action == "fallback":
            report.remapped_relationship_types[written] += 1
        rows.relationships.append(RelRow(src, rtype, dst, [doc.id], rel.description[:500],
                                         chunks=[f"{doc.id}#{index}"]))


def _surname_aliases(rows: DocRows) -> dict[str, str]:
    """Person keys of one word ("Mr. Viersen" → "Person:viersen") that match the last word of
    exactly one full name of the same document: key → that name's key. Only within a
    document: a surname alone never joins two documents' people."""
    persons = {row.key: row for row, _ in rows.entities if row.type == "Person"}
    full: dict[str, set[str]] = {}
    for key, row in persons.items():
        words = normalize(row.name).split()
        if len(words) >= 2:
            full.setdefault(words[-1], set()).add(key)
    out = {}
    for key, row in persons.items():
        words = normalize(row.name).split()
        if len(words) == 1 and len(full.get(words[0], ())) == 1:
            out[key] = next(iter(full[words[0]]))
    return out


def _name_only(row: EntityRow) -> bool:
    """A Person named and nothing more (the model's, a transcript's participant)."""
    return row.type == "Person" and not row.emails and row.namesake_of is None


def _namesakes(docs: list[DocRows], people: PeopleLookup) -> dict[str, list[Candidate]]:
    """The names the batch mentions alone that Persons hold — the graph's, and the contacts of
    this batch — each with its candidates in key order (namesakes where there are several)."""
    names = {row.key for rows in docs for row, _ in rows.entities if _name_only(row)}
    if not names:
        return {}
    found = {name: {c.key: c for c in cs} for name, cs in people(names).items()}
    for rows in docs:
        employers = defaultdict(set)
        for rel in rows.relationships:
            if rel.type == "WORKS_FOR":
                employers[rel.src].add(rel.dst)
        for row, _ in rows.entities:
            name = row.namesake_of or row.key
            if row.type == "Person" and row.emails and name in names:
                had = found.setdefault(name, {}).get(row.key, Candidate(row.key))
                phones = {k for p in row.phones if (k := phone_key(p))}
                found[name][row.key] = Candidate(row.key, had.emails | set(row.emails),
                                                 had.employers | employers[row.key],
                                                 had.phones | phones)
    return {name: sorted(cs.values(), key=lambda c: c.key) for name, cs in found.items() if cs}


def _employers(rows: DocRows, key: str) -> set[str]:
    return {r.dst for r in rows.relationships if r.type == "WORKS_FOR" and r.src == key}


def _colleagues(docs: list[DocRows], namesakes: dict[str, list[Candidate]],
                lookup: ColleagueLookup) -> dict[str, dict[str, str]]:
    """For the employers of the contacts without an address whose name no Person holds: who
    works there — the graph's (one lookup a batch) and this batch's contacts."""
    orgs = {org for rows in docs if rows.doc.records for row, _ in rows.entities
            if _name_only(row) and row.key not in namesakes
            for org in _employers(rows, row.key)}
    if not orgs:
        return {}
    found = lookup(orgs)
    for rows in docs:
        for row, _ in rows.entities:
            for org in _employers(rows, row.key) & orgs if row.type == "Person" else ():
                found.setdefault(org, {}).setdefault(row.key, row.name)
    return found


def _colleague(rows: DocRows, row: EntityRow, colleagues: dict[str, dict[str, str]]
               ) -> tuple[str, str, str] | None:
    """The one Person, at the employer this contact record gives, whose name this one can be
    a shorter spelling of (an initial, a nickname: resolve.variant_of) — its key, its name and
    that evidence — or None when none or several are."""
    fits: dict[str, tuple[str, str, str]] = {}
    for org in sorted(_employers(rows, row.key)):
        for key, name in sorted(colleagues.get(org, {}).items()):
            kind = variant_of(row.name, name) if key != row.key else None
            if kind and not rows.split(key, row.name):
                fits.setdefault(key, (key, name, f"{kind} of {name}, employer {org}"))
    return next(iter(fits.values())) if len(fits) == 1 else None


def _fitting(candidates: list[Candidate], rows: DocRows) -> tuple[Candidate, str] | None:
    """The one candidate the document's context fits — its address or phone in the text, or
    an organization it works for among the document's — with that evidence, or None when
    several or none do."""
    text = rows.doc.text.casefold()
    phones = phones_in(text)
    orgs = {row.key for row, _ in rows.entities if row.type == "Organization"}
    fit = []
    for c in candidates:
        employer = sorted(c.employers & orgs)
        address = sorted(e for e in c.emails if e.casefold() in text)
        phone = sorted(c.phones & phones)
        if employer or address or phone:
            fit.append((c, f"employer {employer[0]} in the document" if employer
                        else f"e-mail {address[0]} in the text" if address
                        else f"phone {phone[0]} in the text"))
    return fit[0] if len(fit) == 1 else None


def _employed_elsewhere(rows: DocRows, key: str, candidates: list[Candidate]) -> str | None:
    """The employer a contact record without an address gives for `key` when it conflicts
    with every Person of that name (each has employers, none of them this one): a namesake.
    Only a record is such evidence; a WORKS_FOR the model wrote is not."""
    if not rows.doc.records or not candidates:
        return None
    employers = _employers(rows, key)
    if employers and all(c.employers and not c.employers & employers for c in candidates):
        return min(employers)
    return None


def _settle(rows: DocRows, keys: dict[str, str], namesakes: dict[str, list[Candidate]],
            report: BatchReport, judge: Judge | None = None,
            colleagues: dict[str, dict[str, str]] | None = None
            ) -> tuple[dict[str, str | None], dict[str, str]]:
    """Where a name alone of this document has namesakes: its key → the one its context fits,
    or → None (linked to none; listed in the report). A document that names the person with
    evidence too (a contact of that key) means that one. A candidate `graph split` keeps this
    name apart from is none; the link made is recorded as a join. Where the context fits no
    single one, `judge` (the serving model, tasks/extraction/judge.py) decides, if given. A
    contact whose employer conflicts with every Person of its name is a namesake of its own,
    keyed by the name and that employer (second mapping: its key → the name's). A contact
    record without an address whose name no Person holds joins the one colleague at its
    employer whose name it can be a shorter spelling of (an initial, a nickname:
    `colleagues`)."""
    evidenced = {keys.get(row.key, row.key) for row, _ in rows.entities
                 if not _name_only(row)} | rows.settled
    out: dict[str, str | None] = {}
    apart: dict[str, str] = {}
    for row, _ in rows.entities:
        key = keys.get(row.key, row.key)
        if key in out or key in evidenced or not _name_only(row):
            continue
        candidates = [c for c in namesakes.get(key, []) if not rows.split(c.key, row.name)]
        employer = _employed_elsewhere(rows, row.key, candidates)
        if employer:
            out[key] = f"{key} ({employer})"
            apart[f"{key} ({employer})"] = key
            report.namesakes_apart += 1
            continue
        if key not in namesakes and rows.doc.records:
            colleague = _colleague(rows, row, colleagues or {})
            if colleague:
                joined, name, evidence = colleague
                out[key] = joined
                rows.joins.append(Join(joined, row.name, evidence))
                # the longer name is the entity's, whichever row of a batch comes first
                row.aliases, row.name = list(dict.fromkeys([*row.aliases, row.name])), name
            continue
        if len(namesakes.get(key, [])) < 2:
            continue  # one Person of the name (or none): the name is it
        pick, verdict = _fitting(candidates, rows), None
        if pick is None and judge is not None and candidates:
            verdict = judge(rows.doc, row.name, candidates)
            if verdict.key is not None:
                pick = (next(c for c in candidates if c.key == verdict.key),
                        f"judge: {verdict.reasons}")
        out[key] = pick[0].key if pick else None
        if pick:
            report.namesakes_linked += 1
            rows.joins.append(Join(pick[0].key, row.name, pick[1]))
        else:
            facts = sum(key in (keys.get(r.src, r.src), keys.get(r.dst, r.dst))
                        for r in rows.relationships)
            report.unlinked.append(UnlinkedMention(
                document=rows.doc.id, name=row.name, relationships=facts,
                candidates=[c.key for c in candidates],
                judge=verdict.reasons if verdict else ""))
    return out, apart


def _join(rows: DocRows, batch: GraphBatch, report: BatchReport,
          namesakes: dict[str, list[Candidate]], judge: Judge | None = None,
          colleagues: dict[str, dict[str, str]] | None = None) -> None:
    """The document's rows into the batch, each one-word alias under its full name, and each
    name alone of a name with namesakes under the one its context fits (or left out); each
    such join, and the document's joins by address, recorded with its evidence. `graph split`
    keeps a form from the entity it names."""
    names = {row.key: row.name for row, _ in rows.entities}
    aliases = {one: full for one, full in _surname_aliases(rows).items()
               if not rows.split(full, names[one])}
    report.aliases_resolved += len(aliases)
    rows.joins += [Join(full, names[one], f"surname of {names[full]} in the document")
                   for one, full in aliases.items()]
    settled, apart = _settle(rows, aliases, namesakes, report, judge, colleagues)

    def final(key: str) -> str | None:
        key = aliases.get(key, key)
        return settled.get(key, key)

    for row, index in rows.entities:
        key = final(row.key)
        if key is None:
            continue  # linked to none: listed in the report
        spelled = list(dict.fromkeys([*row.aliases, row.name]))  # kept where it joins another
        if row.key in aliases:
            row = replace(row, name=names[aliases[row.key]], aliases=spelled)
        if key != row.key:
            row = replace(row, key=key, namesake_of=apart.get(key, row.namesake_of),
                          aliases=[a for a in spelled if a != row.name])
        batch.add_entity(row, rows.doc.id, index)
    for rel in rows.relationships:
        src, dst = final(rel.src), final(rel.dst)
        if src is None or dst is None:
            continue  # counted in the unlinked mention's record
        if src == dst:
            report.dangling_relationships += 1
            continue
        batch.add_relationship(replace(rel, src=src, dst=dst))
    for j in rows.joins:
        key = final(j.key)
        if key is not None:
            batch.joins[key, rows.doc.id, j.form] = j.evidence
            report.joins[j.evidence.split()[0].rstrip(":")] += 1
    report.namesakes_apart += sum(row.namesake_of is not None for row, _ in rows.entities)


def build_batch(outcomes: list[DocOutcome], model: str, email_keys: dict[str, str],
                report: BatchReport, ontology: GraphSchema | None = None,
                gleanings: int = 0, people: PeopleLookup = _nobody,
                splits: dict[str, set[str]] | None = None,
                judge: Judge | None = None,
                colleagues: ColleagueLookup = _no_colleagues) -> GraphBatch:
    """The batch the documents of `outcomes` write; `email_keys`: e-mail address → Person key
    (a contact's evidence), `people`: the graph's Persons of a name (a name alone's), `splits`:
    entity key → the forms `graph split` keeps apart from it, `judge`: what settles a name
    alone that evidence leaves open (None: it is linked to none), `colleagues`: the graph's
    Persons at an organization (a contact's other spelling of a name)."""
    ontology = ontology or default_schema()
    batch = GraphBatch()
    now = now_iso()
    docs: list[DocRows] = []
    for o in outcomes:
        if o.error or o.deferred:
            continue
        d = o.doc
        batch.documents.append({"id": d.id, "stream": d.stream, "path": d.path, "hash": d.hash,
                                "model": model,
                                "prompt_version": document_version(d, ontology, gleanings),
                                "extracted_at": now})
        for ca in o.chunks:
            c = ca.chunk
            batch.add_chunk(ChunkRow(id=f"{d.id}#{c.index}", document=d.id, index=c.index,
                                     start=c.start, end=c.end, text=c.text))
        rows = DocRows(d, splits=splits or {})
        _deterministic(d, rows, email_keys, ontology, report)
        _from_llm(o, rows, report, ontology)
        report.gleaning_failures += o.gleaning_failures
        docs.append(rows)
    namesakes = _namesakes(docs, people)
    at = _colleagues(docs, namesakes, colleagues)
    for rows in docs:
        _join(rows, batch, report, namesakes, judge, at)
    return batch
