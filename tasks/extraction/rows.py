"""The rows a document contributes to the graph, and the ones written without the model: a
transcript's meeting and participants from its front matter, a contacts file's people, their
e-mail addresses and organizations.

A stream's rows writer (tasks/extraction/streams.py names it; answers.py calls it) adds to a
document's DocRows with the graph schema's labels, where the schema has them; a relationship
the schema does not allow is counted in `pruned` ("Source TYPE Target") and not written. What
these rows depend on is versioned by tasks/extraction/prompt.py (deterministic_version).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tasks.extraction.loaders import Document
from tasks.extraction.resolve import looks_like_person_name, phone_key, resolve
from tasks.graph.ontology import GraphSchema
from tasks.graph.store import EntityRow, RelRow


def entity(entity_type: str, raw: str, description: str = "") -> EntityRow:
    """The row of an entity named `raw`: its resolved key and name, the spelling as an alias.
    An organization's name is an alias too, for the node another spelling may have named
    first ("Contoso Limited" on "Contoso Ltd"); the store keeps no alias equal to the name."""
    key, r = resolve(entity_type, raw)
    aliases = [raw.strip()] if raw.strip() != r.name else []
    if entity_type == "Organization":
        aliases.append(r.name)
    return EntityRow(key=key, type=entity_type, name=r.name, aliases=aliases,
                     description=description.strip(), affiliation=r.affiliation)


TEL = "tel:"  # an evidence key of a phone: TEL + resolve.phone_key(number)


def tel(phone: str) -> str | None:
    """The evidence key of a phone number (None: too short to compare)."""
    key = phone_key(phone)
    return TEL + key if key else None


@dataclass(frozen=True)
class Join:
    """A form of a name this document put under an entity by evidence beyond the name: what
    `graph merges` lists and `graph split` undoes (tasks/graph/store.py GraphBatch.joins)."""

    key: str
    form: str
    evidence: str


@dataclass
class DocRows:
    """What one document contributes, before aliases are resolved and it joins the batch.
    `splits`: entity key → the forms (lower case) no evidence may join to it (`graph split`);
    `settled`: the Person keys a contact's phone chose among the Persons of its name (no name
    alone to settle: tasks/extraction/answers.py `_settle`)."""

    doc: Document
    entities: list[tuple[EntityRow, int | None]] = field(default_factory=list)  # chunk index
    relationships: list[RelRow] = field(default_factory=list)
    joins: list[Join] = field(default_factory=list)
    splits: dict[str, set[str]] = field(default_factory=dict)
    settled: set[str] = field(default_factory=set)

    def split(self, key: str, form: str) -> bool:
        """Whether `graph split` keeps `form` apart from the entity `key`."""
        return form.strip().lower() in self.splits.get(key, ())

    def add(self, row: EntityRow, chunk: int | None = None) -> None:
        self.entities.append((row, chunk))


# A stream's rows written without the model: (document, its rows so far, e-mail address (or
# TEL + phone key) → Person key across the batch, the graph schema, pruned relationships by
# pattern) → None.
RowsWriter = Callable[[Document, DocRows, dict[str, str], GraphSchema, Counter[str]], None]


def _allowed(ontology: GraphSchema, pruned: Counter[str], pattern: tuple[str, str, str]) -> bool:
    src, rel, dst = pattern
    if ontology.node(src) and ontology.node(dst) and ontology.allows(src, rel, dst):
        return True
    pruned[f"{src} {rel} {dst}"] += 1
    return False


def transcript_rows(doc: Document, rows: DocRows, email_keys: dict[str, str],
                    ontology: GraphSchema, pruned: Counter[str]) -> None:
    """The meeting (an Event) and each participant who looks like a person, who
    PARTICIPATED_IN it."""
    if not ontology.node("Event"):
        return
    meeting = entity("Event", str(doc.metadata.get("title") or doc.id),
                     f"Meeting {doc.metadata.get('meeting_id', '')}".strip())
    rows.add(meeting)
    for raw in doc.metadata.get("participants", []):
        if not looks_like_person_name(raw) or not ontology.node("Person"):
            continue
        person = entity("Person", raw)
        rows.add(person)
        if _allowed(ontology, pruned, ("Person", "PARTICIPATED_IN", "Event")):
            rows.relationships.append(RelRow(person.key, "PARTICIPATED_IN", meeting.key,
                                             [doc.id]))


def _kin_by_phone(name_key: str, name: str, phones: list[str], evidence: dict[str, str],
                  rows: DocRows) -> tuple[str, str] | None:
    """(the phone as written, the Person of this name — the name's own or a namesake — that
    holds it), or None. Only a Person of the same name: a phone alone never joins two names."""
    for phone in phones:
        key = tel(phone)
        kin = evidence.get(key) if key else None
        if kin and (kin == name_key or kin.startswith((name_key + " <", name_key + " ("))) \
                and not rows.split(kin, name):
            return phone, kin
    return None


def contact_rows(doc: Document, rows: DocRows, email_keys: dict[str, str],
                 ontology: GraphSchema, pruned: Counter[str]) -> None:
    """Each contact a Person (with e-mail addresses and phones), who WORKS_FOR their
    organization. Contacts unify by e-mail: a known address wins over the spelling of the
    name. A namesake is kept apart: when the name's Person holds other addresses and none of
    this contact's, the contact is a second Person, keyed by the name and its first address
    ("Person:john smith <john.smith@contoso.com>"), which later runs find by that address —
    unless a phone of the contact is one a Person of its name holds: then it is that Person
    (a second address of the same person). `email_keys` holds the batch's addresses and
    phones ("tel:" + resolve.phone_key) and those of the graph's Persons of these names
    (tasks/extraction/batch.py). A join by address or phone is recorded (rows.joins), and none
    is made where `graph split` keeps the name apart from that Person."""
    if not ontology.node("Person"):
        return
    held: dict[str, set[str]] = {}  # Person key → its addresses
    for e, k in email_keys.items():
        if not e.startswith(TEL):
            held.setdefault(k, set()).add(e)
    for rec in doc.records:
        person = entity("Person", rec["name"], rec.get("title") or "")
        emails, phones = list(rec["emails"]), list(rec["phones"])
        address, known = next(((e, email_keys[e]) for e in emails if e in email_keys),
                              (None, None))
        if known and rows.split(known, person.name):
            known = None  # as if the address were not known: the name's own Person
        kin = None if known else _kin_by_phone(person.key, person.name, phones, email_keys, rows)
        apart = known is None and emails and held.get(person.key)  # the name is another's
        if known and known != person.key:
            if not known.startswith(person.key + " <"):  # a namesake's own address: no join
                rows.joins.append(Join(known, person.name, f"e-mail {address}"))
            person.aliases = sorted({*person.aliases, person.name})
            person.key = known
        elif kin:  # the phone says which Person of the name it is
            if apart or kin[1] != person.key:
                rows.joins.append(Join(kin[1], person.name, f"phone {kin[0]}"))
            person.key = kin[1]
            rows.settled.add(kin[1])
        elif apart:
            person.namesake_of, person.key = person.key, f"{person.key} <{emails[0]}>"
        person.emails, person.phones = emails, phones
        for e in emails:
            email_keys.setdefault(e, person.key)
            held.setdefault(person.key, set()).add(e)
        for phone in phones:
            if key := tel(phone):
                email_keys.setdefault(key, person.key)
        rows.add(person)
        if rec.get("organization") and ontology.node("Organization"):
            org = entity("Organization", rec["organization"])
            rows.add(org)
            if _allowed(ontology, pruned, ("Person", "WORKS_FOR", "Organization")):
                rows.relationships.append(RelRow(person.key, "WORKS_FOR", org.key,
                                                 [doc.id], rec.get("title") or ""))
