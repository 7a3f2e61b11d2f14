"""The rows phase 1 writes without the model (tasks/extraction/answers.py _deterministic, through
build_batch): a transcript's meeting and participants from its front matter, a contacts file's
people, their e-mail addresses and organizations — exact rows, worked out by hand."""

from dataclasses import replace

from tasks.extraction.answers import BatchReport, build_batch
from tasks.extraction.calls import DocOutcome
from tasks.extraction.documents import Document
from tasks.graph.ontology import DEFAULT_SCHEMA, load_schema
from tasks.graph.store import EntityRow


def transcript(metadata: dict[str, object]) -> Document:
    return Document("transcripts/m.md", "transcripts", "/x/m.md", "h-m", "", metadata)


def contacts(*records: dict[str, object]) -> Document:
    full = [{"name": "", "title": "", "emails": [], "phones": [], "organization": None, **r}
            for r in records]
    return Document("contacts/c.json", "contacts", "/x/c.json", "h-c", "", {}, full)


def rels(batch: object) -> list[tuple[str, str, str, list[str], str]]:
    return sorted((r.src, r.type, r.dst, r.doc_ids, r.description)
                  for r in batch.relationships.values())  # type: ignore[attr-defined]


def test_a_transcripts_meeting_and_its_people_come_from_its_front_matter() -> None:
    d = transcript({"title": "Budget review", "meeting_id": "M7",
                    "participants": ["Ada Lovelace", "Grad A", "Dr. Charles Babbage"]})
    report = BatchReport()
    batch = build_batch([DocOutcome(d, [])], "m", {}, report)
    assert batch.entities == {
        "Event:budget review": EntityRow("Event:budget review", "Event", "Budget review",
                                         description="Meeting M7"),
        "Person:ada lovelace": EntityRow("Person:ada lovelace", "Person", "Ada Lovelace"),
        "Person:charles babbage": EntityRow("Person:charles babbage", "Person",
                                            "Charles Babbage", aliases=["Dr. Charles Babbage"])}
    assert rels(batch) == [
        ("Person:ada lovelace", "PARTICIPATED_IN", "Event:budget review", [d.id], ""),
        ("Person:charles babbage", "PARTICIPATED_IN", "Event:budget review", [d.id], "")]
    # no chunk names them: mentions without chunk indexes
    assert batch.mentions[("Person:ada lovelace", d.id)] == set()
    assert not report.pruned_relationships and not report.rejected_entity_types


def test_a_meeting_without_a_title_or_id_is_named_by_its_document() -> None:
    batch = build_batch([DocOutcome(transcript({}), [])], "m", {}, BatchReport())
    assert list(batch.entities.values()) == [
        EntityRow("Event:transcripts m md", "Event", "transcripts/m.md", description="Meeting")]
    assert rels(batch) == []


def test_contacts_join_by_email_and_work_for_their_organization() -> None:
    d = contacts({"name": "Ada Lovelace", "title": "Engineer", "emails": ["ada@x.org"],
                  "phones": ["+44 1"], "organization": "Acme Ltd"},
                 {"name": "A. King", "emails": ["ada@x.org", "ak@y.org"]},
                 {"name": "Bob Stone", "emails": ["bob@x.org"]})
    known = {"bob@x.org": "Person:robert stone"}  # an address the graph already holds
    batch = build_batch([DocOutcome(d, [])], "m", known, BatchReport())
    assert batch.entities["Person:ada lovelace"] == EntityRow(
        "Person:ada lovelace", "Person", "Ada Lovelace", aliases=["A. King"],
        description="Engineer", emails=["ada@x.org", "ak@y.org"], phones=["+44 1"])
    assert batch.entities["Person:robert stone"].aliases == ["Bob Stone"]
    assert "Person:bob stone" not in batch.entities and "Person:a. king" not in batch.entities
    assert batch.entities["Organization:acme"].name == "Acme Ltd"
    assert rels(batch) == [("Person:ada lovelace", "WORKS_FOR", "Organization:acme",
                            [d.id], "Engineer")]
    assert known == {"bob@x.org": "Person:robert stone", "ada@x.org": "Person:ada lovelace",
                     "ak@y.org": "Person:ada lovelace"}


def test_a_schema_without_the_pattern_prunes_the_relationship_and_keeps_the_rows() -> None:
    schema = load_schema(DEFAULT_SCHEMA)
    assert schema.node("Event") and schema.allows("Person", "WORKS_FOR", "Organization")
    no_pattern = replace(schema, patterns=frozenset(
        p for p in schema.patterns if p[1] not in {"WORKS_FOR", "PARTICIPATED_IN"}))
    report = BatchReport()
    d = contacts({"name": "Ada Lovelace", "organization": "Acme Ltd"})
    t = transcript({"title": "T", "participants": ["Ada Lovelace"]})
    batch = build_batch([DocOutcome(d, []), DocOutcome(t, [])], "m", {}, report, no_pattern)
    assert rels(batch) == []
    assert report.pruned_relationships == {"Person WORKS_FOR Organization": 1,
                                           "Person PARTICIPATED_IN Event": 1}
    assert set(batch.entities) == {"Person:ada lovelace", "Organization:acme", "Event:t"}


def test_a_contact_without_a_title_has_no_description_and_each_pruned_one_is_counted() -> None:
    schema = load_schema(DEFAULT_SCHEMA)
    d = contacts({"name": "Ada Lovelace", "title": None, "organization": "Acme Ltd"},
                 {"name": "Bob Stone", "organization": "Acme Ltd"})
    batch = build_batch([DocOutcome(d, [])], "m", {}, BatchReport())
    assert [batch.entities[k].description for k in ("Person:ada lovelace", "Person:bob stone")
            ] == ["", ""]
    assert rels(batch) == [
        ("Person:ada lovelace", "WORKS_FOR", "Organization:acme", [d.id], ""),
        ("Person:bob stone", "WORKS_FOR", "Organization:acme", [d.id], "")]
    no_pattern = replace(schema, patterns=frozenset(
        p for p in schema.patterns if p[1] != "WORKS_FOR"))
    report = BatchReport()
    build_batch([DocOutcome(d, [])], "m", {}, report, no_pattern)
    assert report.pruned_relationships == {"Person WORKS_FOR Organization": 2}


def test_a_name_with_its_organization_in_parentheses_keeps_it_as_the_affiliation() -> None:
    d = transcript({"title": "T", "participants": ["Ada Lovelace (Acme Ltd)"]})
    batch = build_batch([DocOutcome(d, [])], "m", {}, BatchReport())
    ada = batch.entities["Person:ada lovelace"]
    assert (ada.name, ada.affiliation, ada.aliases) == ("Ada Lovelace", "Acme Ltd",
                                                        ["Ada Lovelace (Acme Ltd)"])


def test_namesakes_with_their_own_addresses_are_two_people_and_a_known_address_finds_each(
        ) -> None:
    """Issue 52: two contacts named John Smith with different addresses and employers are two
    Persons; the second is keyed by the name and its address, and a later run finds each by
    its address. The same name with the same address, or with none, is the first one."""
    d = contacts({"name": "John Smith", "emails": ["john.smith@contoso.com"],
                  "organization": "Contoso Ltd"},
                 {"name": "John Smith", "emails": ["jsmith@northwind.example"],
                  "organization": "Northwind Analytics, Inc."},
                 {"name": "Mr. John Smith", "emails": ["john.smith@contoso.com", "js@x.org"]},
                 {"name": "John Smith"})
    known: dict[str, str] = {}
    batch = build_batch([DocOutcome(d, [])], "m", known, BatchReport())
    second = "Person:john smith <jsmith@northwind.example>"
    people = {k: (e.name, e.emails) for k, e in batch.entities.items() if e.type == "Person"}
    assert people == {
        "Person:john smith": ("John Smith", ["john.smith@contoso.com", "js@x.org"]),
        second: ("John Smith", ["jsmith@northwind.example"])}
    assert rels(batch) == [
        ("Person:john smith", "WORKS_FOR", "Organization:contoso", [d.id], ""),
        (second, "WORKS_FOR", "Organization:northwind analytics", [d.id], "")]
    # the next night: the graph holds both; each contact finds its own by address
    again = build_batch([DocOutcome(d, [])], "m", dict(known), BatchReport())
    assert set(again.entities) == set(batch.entities)
    # the graph holds a John Smith with another address: a new one is his namesake
    later = contacts({"name": "John Smith", "emails": ["john@fabrikam.example"]})
    held = {"john.smith@contoso.com": "Person:john smith"}
    batch = build_batch([DocOutcome(later, [])], "m", held, BatchReport())
    assert list(batch.entities) == ["Person:john smith <john@fabrikam.example>"]


def test_an_organizations_legal_forms_punctuation_and_the_join_one_organization() -> None:
    d = contacts(*({"name": f"P{i}", "organization": org} for i, org in enumerate((
        "Northwind Analytics", "Northwind Analytics Inc.", "Northwind Analytics, Inc.",
        "Contoso Ltd", "Contoso Ltd.", "Contoso Limited", "The Procter & Gamble Co.",
        "Procter and Gamble", "Contoso Analytics"))))
    batch = build_batch([DocOutcome(d, [])], "m", {}, BatchReport())
    orgs = {k: (e.name, sorted(e.aliases)) for k, e in batch.entities.items()
            if e.type == "Organization"}
    # each spelling an alias (the store drops the one that is the node's name)
    assert orgs == {
        "Organization:northwind analytics": ("Northwind Analytics", [
            "Northwind Analytics", "Northwind Analytics Inc.", "Northwind Analytics, Inc."]),
        "Organization:contoso": ("Contoso Ltd", ["Contoso Limited", "Contoso Ltd",
                                                 "Contoso Ltd."]),
        "Organization:procter and gamble": ("The Procter & Gamble Co.", [
            "Procter and Gamble", "The Procter & Gamble Co."]),
        "Organization:contoso analytics": ("Contoso Analytics", ["Contoso Analytics"])}
