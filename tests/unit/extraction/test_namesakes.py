"""Issue 52: a name alone (the model's, a transcript's participant) whose name several Persons
hold links to the one its document's context fits — that Person's address in the text, or an
organization it works for among the document's — and to none when several or none fit, listed
in the report with the facts left out. Exact rows, worked out by hand."""

from tasks.extraction.answers import BatchReport, build_batch
from tasks.extraction.calls import ChunkAnswer, DocOutcome
from tasks.extraction.chunking import Chunk
from tasks.extraction.documents import Document
from tasks.extraction.judge import Candidate
from tasks.extraction.schema import Extraction
from tasks.records import UnlinkedMention

JOHN = "Person:john smith"
NORTH = "Person:john smith <jsmith@northwind.example>"
ADA = "Person:ada lovelace"
CONTOSO, NORTHWIND = "Organization:contoso", "Organization:northwind analytics"
GRAPH = [Candidate(JOHN, frozenset({"john.smith@contoso.com"}), frozenset({CONTOSO})),
         Candidate(NORTH, frozenset({"JSmith@northwind.example"}), frozenset({NORTHWIND}))]


def research(name: str, text: str, names: list[tuple[str, str]],
             rels: list[tuple[str, str, str]] = ()) -> DocOutcome:
    d = Document(f"research/{name}", "research", f"/x/{name}", "h-" + name, text, {})
    answer = Extraction.model_validate({
        "entities": [{"name": n, "type": t, "description": ""} for n, t in names],
        "relationships": [{"source": s, "type": r, "target": t, "description": ""}
                          for s, r, t in rels]})
    return DocOutcome(d, [ChunkAnswer(Chunk(0, 0, len(text), text), [answer])])


def mentioned(batch: object, key: str) -> list[str]:
    return sorted(d for k, d in batch.mentions if k == key)  # type: ignore[attr-defined]


def test_a_name_alone_links_to_the_namesake_its_document_fits_and_to_none_when_it_cannot_tell(
        ) -> None:
    asked: list[set[str]] = []

    def people(names: set[str]) -> dict[str, list[Candidate]]:
        asked.append(names)
        return {JOHN: GRAPH[::-1]} if JOHN in names else {}  # in no order

    docs = [
        research("a.md", "John Smith presented the roadmap of Contoso Ltd.",
                 [("John Smith", "Person"), ("Contoso Ltd", "Organization")],
                 [("John Smith", "WORKS_FOR", "Contoso Ltd")]),
        research("b.md", "John Smith of Northwind Analytics met Ada Lovelace.",
                 [("John Smith", "Person"), ("Northwind Analytics", "Organization"),
                  ("Ada Lovelace", "Person")],
                 [("John Smith", "RELATED_TO", "Ada Lovelace")]),
        research("c.md", "Write to John Smith at jsmith@NORTHWIND.example.",
                 [("John Smith", "Person")]),
        research("d.md", "John Smith met Ada Lovelace.",
                 [("John Smith", "Person"), ("Ada Lovelace", "Person")],
                 [("John Smith", "RELATED_TO", "Ada Lovelace"),
                  ("Ada Lovelace", "RELATED_TO", "John Smith")]),
        research("e.md", "John Smith compared Contoso Ltd with Northwind Analytics.",
                 [("John Smith", "Person"), ("Contoso Ltd", "Organization"),
                  ("Northwind Analytics", "Organization")])]
    report = BatchReport()
    batch = build_batch(docs, "m", {}, report, people=people)
    assert asked == [{JOHN, ADA}]  # one lookup a batch, of the names written alone
    assert mentioned(batch, JOHN) == ["research/a.md"]
    assert mentioned(batch, NORTH) == ["research/b.md", "research/c.md"]
    assert mentioned(batch, ADA) == ["research/b.md", "research/d.md"]
    assert batch.entities[NORTH].name == "John Smith"
    assert sorted(batch.relationships) == [(JOHN, "WORKS_FOR", CONTOSO),
                                           (NORTH, "RELATED_TO", ADA)]
    assert report.namesakes_linked == 3
    assert report.unlinked == [
        UnlinkedMention(document="research/d.md", name="John Smith", candidates=[JOHN, NORTH],
                        relationships=2),
        UnlinkedMention(document="research/e.md", name="John Smith", candidates=[JOHN, NORTH],
                        relationships=0)]
    assert report.dangling_relationships == 0


def test_a_name_with_one_person_links_as_before_and_a_namesake_made_in_the_batch_counts() -> None:
    """Without namesakes nothing changes. A contact of this batch that becomes a namesake (the
    graph's John Smith holds another address) is a candidate at once."""
    alone = research("a.md", "John Smith met Ada Lovelace.",
                     [("John Smith", "Person"), ("Ada Lovelace", "Person")],
                     [("John Smith", "RELATED_TO", "Ada Lovelace")])
    report = BatchReport()
    batch = build_batch([alone], "m", {}, report, people=lambda names: {JOHN: GRAPH[:1]})
    assert sorted(batch.relationships) == [(JOHN, "RELATED_TO", ADA)]
    assert (report.namesakes_linked, report.unlinked) == (0, [])

    contact = Document("contacts/c.json", "contacts", "/x/c.json", "h-c", "", {}, [
        {"name": "John Smith", "title": "", "emails": ["jsmith@northwind.example"],
         "phones": [], "organization": "Northwind Analytics, Inc."}])
    held = {"john.smith@contoso.com": JOHN}  # known_people: the graph's John Smith's address
    write = research("w.md", "Mail John Smith: jsmith@northwind.example",
                     [("John Smith", "Person")])
    works = research("x.md", "John Smith, Northwind Analytics", [
        ("John Smith", "Person"), ("Northwind Analytics", "Organization")])
    report = BatchReport()
    batch = build_batch([alone, write, works, DocOutcome(contact)], "m", held, report,
                        people=lambda names: {JOHN: GRAPH[:1]})
    assert batch.entities[NORTH].namesake_of == JOHN  # the contact's row, merged in last
    assert mentioned(batch, NORTH) == ["contacts/c.json", "research/w.md", "research/x.md"]
    assert mentioned(batch, JOHN) == []
    assert report.unlinked == [UnlinkedMention(
        document="research/a.md", name="John Smith", candidates=[JOHN, NORTH], relationships=1)]
    assert sorted(batch.relationships) == [(NORTH, "WORKS_FOR", NORTHWIND)]
    # the night's summary counts: one contact kept apart, w.md by its address, x.md by employer
    assert (report.namesakes_apart, report.joins) == (1, {"e-mail": 1, "employer": 1})


def test_each_join_is_recorded_with_its_evidence_and_a_split_form_joins_no_more() -> None:
    """Issue 52, item 3: what put a document's name under an entity beside the name itself — an
    address a contact shares, the document's context, a surname — is a join with its
    evidence. With `graph split` keeping that form from that entity, the same documents make
    no such join: the contact is its own name's Person, the name alone links to none, the
    surname stays its own."""
    contacts = Document("contacts/c.json", "contacts", "/x/c.json", "h-c", "", {}, [
        {"name": "Priya Raman", "title": "", "emails": ["p.raman@contoso.com"], "phones": [],
         "organization": ""},
        {"name": "P. Raman", "title": "", "emails": ["p.raman@contoso.com"], "phones": [],
         "organization": ""}])
    mail = research("m.md", "Write to John Smith at jsmith@NORTHWIND.example.",
                     [("John Smith", "Person")])
    talk = research("t.md", "Arnold Viersen spoke. Mr. Viersen then left.",
                    [("Arnold Viersen", "Person"), ("Mr. Viersen", "Person")])
    docs = [DocOutcome(contacts), mail, talk]
    priya, viersen = "Person:priya raman", "Person:arnold viersen"

    def people(names: set[str]) -> dict[str, list[Candidate]]:
        return {JOHN: GRAPH} if JOHN in names else {}

    joined = BatchReport()
    batch = build_batch(docs, "m", {}, joined, people=people)
    assert (joined.joins, joined.namesakes_apart) == ({"e-mail": 2, "surname": 1}, 0)
    assert batch.joins == {
        (priya, "contacts/c.json", "P. Raman"): "e-mail p.raman@contoso.com",
        (NORTH, "research/m.md", "John Smith"): "e-mail JSmith@northwind.example in the text",
        (viersen, "research/t.md", "Viersen"): "surname of Arnold Viersen in the document"}

    report = BatchReport()
    split = build_batch(docs, "m", {}, report, people=people, splits={
        priya: {"p. raman"}, NORTH: {"john smith"}, viersen: {"viersen"}})
    assert split.joins == {}
    assert mentioned(split, "Person:p raman") == ["contacts/c.json"]
    assert split.entities["Person:p raman"].emails == ["p.raman@contoso.com"]
    assert mentioned(split, priya) == ["contacts/c.json"]
    assert mentioned(split, NORTH) == [] and mentioned(split, JOHN) == []
    assert report.unlinked == [UnlinkedMention(
        document="research/m.md", name="John Smith", candidates=[JOHN], relationships=0)]
    assert mentioned(split, "Person:viersen") == ["research/t.md"]
    assert (report.aliases_resolved, report.joins) == (0, {})


def test_a_contact_without_an_address_whose_employer_conflicts_is_a_namesake_of_its_own() -> None:
    """Issue 52, item 1: a contact record with no address, at Northwind, where the graph's one
    John Smith works for Contoso: its evidence conflicts, so it is a second Person keyed by the
    name and its employer. At Contoso it is the graph's John Smith. A WORKS_FOR the model wrote
    is no such evidence: the research note's John Smith stays the name's."""
    def record(org: str) -> dict[str, object]:
        return {"name": "John Smith", "title": "", "emails": [], "phones": [],
                "organization": org}

    elsewhere = Document("contacts/n.json", "contacts", "/x/n.json", "h-n", "", {},
                         [record("Northwind Analytics, Inc.")])
    same = Document("contacts/c.json", "contacts", "/x/c.json", "h-c", "", {},
                    [record("Contoso")])
    note = research("r.md", "John Smith works for Northwind Analytics.",
                    [("John Smith", "Person"), ("Northwind Analytics", "Organization")],
                    [("John Smith", "WORKS_FOR", "Northwind Analytics")])
    report = BatchReport()
    batch = build_batch([DocOutcome(elsewhere), DocOutcome(same), note], "m", {}, report,
                        people=lambda names: {JOHN: GRAPH[:1]})
    apart = f"{JOHN} ({NORTHWIND})"
    assert batch.entities[apart].namesake_of == JOHN
    assert batch.entities[apart].name == "John Smith"
    assert mentioned(batch, apart) == ["contacts/n.json"]
    assert mentioned(batch, JOHN) == ["contacts/c.json", "research/r.md"]
    assert sorted(batch.relationships) == [(JOHN, "WORKS_FOR", CONTOSO),
                                           (JOHN, "WORKS_FOR", NORTHWIND),
                                           (apart, "WORKS_FOR", NORTHWIND)]
    assert (report.namesakes_apart, report.joins, report.unlinked) == (1, {}, [])
    # a graph that knows no employer of its John Smith: nothing conflicts, one person
    report = BatchReport()
    batch = build_batch([DocOutcome(elsewhere)], "m", {}, report,
                        people=lambda names: {JOHN: [Candidate(JOHN)]})
    assert mentioned(batch, JOHN) == ["contacts/n.json"] and report.namesakes_apart == 0


def test_a_contact_with_another_spelling_joins_the_one_colleague_it_can_be() -> None:
    """Issue 52, item 2: contact records without an address whose name no Person holds. "Bob
    Smith" at Contoso is the graph's Robert Smith of Contoso (a nickname and an agreeing
    employer); "P. Raman" at Contoso is this batch's Priya Raman of Contoso (an initial). "Bill
    Jones" at Northwind is not Contoso's William Jones (the employer does not agree); "Chris
    Lee" could be Christopher or Christine, both at Contoso: neither. Split, Bob is his own."""
    def record(name: str, org: str) -> dict[str, object]:
        return {"name": name, "title": "", "emails": [], "phones": [], "organization": org}

    contacts = Document("contacts/c.json", "contacts", "/x/c.json", "h-c", "", {}, [
        record("P. Raman", "Contoso"), record("Bob Smith", "Contoso Ltd"),
        record("Priya Raman", "Contoso Limited"), record("Bill Jones", "Northwind Analytics"),
        record("Chris Lee", "Contoso")])
    robert = "Person:robert smith"
    graph = {CONTOSO: {robert: "Robert Smith", "Person:william jones": "William Jones",
                       "Person:christopher lee": "Christopher Lee",
                       "Person:christine lee": "Christine Lee"}}
    asked: list[set[str]] = []

    def colleagues(orgs: set[str]) -> dict[str, dict[str, str]]:
        asked.append(orgs)
        return {o: dict(graph[o]) for o in orgs if o in graph}

    report = BatchReport()
    batch = build_batch([DocOutcome(contacts)], "m", {}, report, colleagues=colleagues)
    assert asked == [{CONTOSO, NORTHWIND}]  # the employers of the names no Person holds
    assert batch.joins == {
        (robert, "contacts/c.json", "Bob Smith"): f"nickname of Robert Smith, employer {CONTOSO}",
        ("Person:priya raman", "contacts/c.json", "P. Raman"):
            f"initial of Priya Raman, employer {CONTOSO}"}
    assert report.joins == {"nickname": 1, "initial": 1}
    assert sorted(k for k in batch.entities if k.startswith("Person:")) == [
        "Person:bill jones", "Person:chris lee", "Person:priya raman", robert]
    assert (batch.entities[robert].name, batch.entities[robert].aliases) == (
        "Robert Smith", ["Bob Smith"])
    # P. Raman's row came first: the entity still takes the longer name
    assert (batch.entities["Person:priya raman"].name,
            batch.entities["Person:priya raman"].aliases) == ("Priya Raman", ["P. Raman"])
    assert sorted(batch.relationships) == [
        ("Person:bill jones", "WORKS_FOR", NORTHWIND), ("Person:chris lee", "WORKS_FOR", CONTOSO),
        ("Person:priya raman", "WORKS_FOR", CONTOSO), (robert, "WORKS_FOR", CONTOSO)]

    split = build_batch([DocOutcome(contacts)], "m", {}, BatchReport(), colleagues=colleagues,
                        splits={robert: {"bob smith"}})
    assert "Person:bob smith" in split.entities and robert not in split.entities
