import time

import pytest

from tasks.graph.falkordb_store import FalkorDBStore
from tasks.graph.store import EntityRow, GraphBatch, GraphStore
from tasks.shared.errors import GraphError
from tests.support.graph_batches import batch_for, mark
from tests.support.graph_dump import dump


def test_upsert_is_idempotent_and_batched(store: GraphStore) -> None:
    b = batch_for("d1", [f"P{i}" for i in range(23)])  # > batch_size 7: several transactions
    store.upsert(b)
    first = dump(store)
    store.upsert(b)
    assert dump(store) == first
    s = store.stats()
    assert s["nodes"]["Person"] == 23 and s["nodes"]["Organization"] == 1
    assert s["relationships"] == {"MENTIONED_IN": 24, "WORKS_FOR": 23}


def test_provenance_is_shared_and_retracted_per_document(store: GraphStore) -> None:
    store.upsert(batch_for("d1", ["Ann", "Bob"]))
    store.upsert(batch_for("d2", ["Bob", "Cy"]))
    mark(store, "d1", "d2")
    rels = {r["p"]: sorted(r["docs"]) for r in store.query(
        "MATCH (p:Person)-[r:WORKS_FOR]->() RETURN p.name AS p, r.doc_ids AS docs")}
    assert rels == {"Ann": ["d1"], "Bob": ["d1", "d2"], "Cy": ["d2"]}

    store.retract(["d1"])  # d1 changed: its contribution goes, d2's stays
    rels = {r["p"]: r["docs"] for r in store.query(
        "MATCH (p:Person)-[r:WORKS_FOR]->() RETURN p.name AS p, r.doc_ids AS docs")}
    assert rels == {"Bob": ["d2"], "Cy": ["d2"]}
    assert store.document_states()["d1"]["hash"] is None
    assert store.prune_orphans() == 1  # Ann: mentioned nowhere now
    store.retract(["d2"], delete=True)
    assert store.prune_orphans() == 3
    assert store.stats() == {"nodes": {"Document": 1}, "relationships": {}}


@pytest.mark.parametrize("evil", [
    "x'}) MATCH (n) DETACH DELETE n //",
    'x"}) DETACH DELETE e //',
    "Robert`) DETACH DELETE (n",
    "$rows {key: 'p'}",
])
def test_cypher_injection_in_names_is_stored_as_data(store: GraphStore, evil: str) -> None:
    store.upsert(batch_for("d1", ["Ann"]))
    b = batch_for("d2", [evil])
    store.upsert(b)
    names = {r["n"] for r in store.query("MATCH (p:Person) RETURN p.name AS n")}
    assert names == {"Ann", evil}
    assert store.stats()["nodes"]["Document"] == 2


def test_email_lookup(store: GraphStore) -> None:
    b = GraphBatch(documents=[{"id": "c", "stream": "contacts", "path": "/c"}])
    b.add_entity(EntityRow("Person:ann lee", "Person", "Ann Lee", emails=["ann@x.org"]), "c")
    store.upsert(b)
    assert store.keys_by_email(["ann@x.org", "nobody@x.org"]) == {"ann@x.org": "Person:ann lee"}


def test_unique_key_constraints_are_enforced(store: GraphStore) -> None:
    if isinstance(store, FalkorDBStore):  # FalkorDB builds them in the background
        for _ in range(100):
            states = {(c["label"], c["status"]) for c in store._graph.list_constraints()}
            if states == {("Entity", "OPERATIONAL"), ("Document", "OPERATIONAL")}:
                break
            time.sleep(0.05)
    store._write("CREATE (:Entity {key: 'dup'})")
    with pytest.raises(GraphError, match="(?i)constraint|already exists"):
        store._write("CREATE (:Entity {key: 'dup'})")


@pytest.mark.parametrize(("field", "value", "why"), [
    ("emails", ["ann@x.org", None], "field emails holds a null at index 1"),
    ("aliases", ["Ann", 3], "field aliases mixes types"),
    ("aliases", [["Ann"]], "field aliases holds a list at index 0"),
    ("description", {"text": "x"}, "field description is a map"),
    ("properties", {"role": None}, "field properties.role is null"),
    ("properties", {"role": {"a": 1}}, "field properties.role is a map"),
])
def test_a_row_neither_store_keeps_fails_the_batch_before_any_write(
        store: GraphStore, field: str, value: object, why: str) -> None:
    """Neo4j refuses nulls inside lists, mixed lists and maps, and SET += drops a null property;
    FalkorDB stores them all. Both stores check every row first and name it."""
    b = batch_for("d1", ["Ann", "Bob"])
    bad = b.entities["Person:bob"]
    setattr(bad, field, value)
    with pytest.raises(GraphError) as err:
        store.upsert(b)
    assert str(err.value).startswith(f"entity 'Person:bob': {why}")
    assert store.stats() == {"nodes": {}, "relationships": {}}  # nothing of the batch


def test_schema_properties_are_stored_and_merged(store: GraphStore) -> None:
    b = GraphBatch(documents=[{"id": "d1", "stream": "t", "path": "/d1"}])
    b.add_entity(EntityRow("Person:ann lee", "Person", "Ann Lee", properties={"role": "chair"}),
                 "d1")
    b.add_entity(EntityRow("Person:bob stone", "Person", "Bob Stone"), "d1")  # none
    store.upsert(b)
    b2 = GraphBatch(documents=[{"id": "d2", "stream": "t", "path": "/d2"}])
    b2.add_entity(EntityRow("Person:ann lee", "Person", "Ann Lee",
                            properties={"riding": "Oakville"}), "d2")
    store.upsert(b2)
    rows = store.query("MATCH (p:Person) RETURN p.name AS n, p.role AS role, "
                       "p.riding AS riding ORDER BY n")
    assert rows == [{"n": "Ann Lee", "role": "chair", "riding": "Oakville"},
                    {"n": "Bob Stone", "role": None, "riding": None}]


def test_namesakes_stay_apart_and_organization_variants_join_on_both_stores(
        store: GraphStore) -> None:
    """Issue 52, through the real store and phase 1's own lookup (known_people): two contacts
    named John Smith with their own addresses are two Persons, on this night and the next;
    a third John Smith with a new address, a later night, is a third; "Contoso Ltd" and
    "Contoso Limited" are one Organization keeping both spellings."""
    from tasks.extraction.answers import BatchReport, build_batch
    from tasks.extraction.batch import known_people
    from tasks.extraction.calls import DocOutcome
    from tasks.extraction.documents import Document

    def contacts(doc_id: str, *people: tuple[str, str, str]) -> Document:
        records = [{"name": n, "title": "", "emails": [e], "phones": [], "organization": o}
                   for n, e, o in people]
        return Document(doc_id, "contacts", f"/x/{doc_id}", "h", "", {}, records)

    def night(*docs: Document) -> None:
        batch = build_batch([DocOutcome(d, []) for d in docs], "m", known_people(store, docs),
                            BatchReport())
        store.upsert(batch)
        mark(store, *(d.id for d in docs))

    def people() -> dict[str, list[str]]:
        return {r["k"]: r["e"] for r in store.query(
            "MATCH (p:Person) RETURN p.key AS k, p.emails AS e")}

    day1 = contacts("contacts/a.json", ("John Smith", "john.smith@contoso.com", "Contoso Ltd"),
                    ("Sam Lee", "sam@contoso.com", "Contoso Ltd"))
    day2 = contacts("contacts/b.json",
                    ("John Smith", "jsmith@northwind.example", "Northwind Analytics, Inc."),
                    ("Sam Lee", "sam@contoso.com", "Contoso Limited"))
    night(day1)
    night(day2)  # the graph holds John Smith with another address: his namesake
    want = {"Person:john smith": ["john.smith@contoso.com"],
            "Person:john smith <jsmith@northwind.example>": ["jsmith@northwind.example"],
            "Person:sam lee": ["sam@contoso.com"]}
    assert people() == want
    first = dump(store)
    night(day1)
    night(day2)  # an unchanged night changes nothing
    assert dump(store) == first
    night(contacts("contacts/c.json", ("John Smith", "john@fabrikam.example", "Fabrikam")))
    assert people() == want | {"Person:john smith <john@fabrikam.example>":
                               ["john@fabrikam.example"]}
    orgs = {r["k"]: (r["n"], sorted(r["a"])) for r in store.query(
        "MATCH (o:Organization) RETURN o.key AS k, o.name AS n, o.aliases AS a")}
    assert orgs == {"Organization:contoso": ("Contoso Ltd", ["Contoso Limited"]),
                    "Organization:northwind analytics": ("Northwind Analytics, Inc.", []),
                    "Organization:fabrikam": ("Fabrikam", [])}
    works = sorted((r["p"], r["o"]) for r in store.query(
        "MATCH (p:Person)-[:WORKS_FOR]->(o:Organization) RETURN p.key AS p, o.key AS o"))
    assert works == [
        ("Person:john smith", "Organization:contoso"),
        ("Person:john smith <john@fabrikam.example>", "Organization:fabrikam"),
        ("Person:john smith <jsmith@northwind.example>", "Organization:northwind analytics"),
        ("Person:sam lee", "Organization:contoso")]


def test_a_name_alone_links_to_the_namesake_its_document_fits_on_both_stores(
        store: GraphStore) -> None:
    """Issue 52, through the real store and phase 1's own lookups (known_people, people_named):
    with two John Smiths in the graph, a document naming John Smith beside Northwind Analytics
    is about the second; one naming him alone is linked to neither and listed, and its fact
    is not written. The namesake is found by its name's key (namesake_of)."""
    from tasks.extraction.answers import BatchReport, build_batch
    from tasks.extraction.batch import known_people, people_named
    from tasks.extraction.calls import ChunkAnswer, DocOutcome
    from tasks.extraction.chunking import Chunk
    from tasks.extraction.documents import Document
    from tasks.extraction.schema import Extraction
    from tasks.records import UnlinkedMention

    north = "Person:john smith <jsmith@northwind.example>"
    contacts = Document("contacts/a.json", "contacts", "/x/a.json", "h", "", {}, [
        {"name": "John Smith", "title": "", "emails": [e], "phones": [], "organization": o}
        for e, o in (("john.smith@contoso.com", "Contoso Ltd"),
                     ("jsmith@northwind.example", "Northwind Analytics, Inc."))])

    def research(name: str, text: str, names: list[tuple[str, str]]) -> DocOutcome:
        d = Document(f"research/{name}", "research", f"/x/{name}", "h", text, {})
        answer = Extraction.model_validate({
            "entities": [{"name": n, "type": t, "description": ""} for n, t in names],
            "relationships": [{"source": "John Smith", "type": "RELATED_TO",
                               "target": "Ada Lovelace", "description": ""}]})
        return DocOutcome(d, [ChunkAnswer(Chunk(0, 0, len(text), text), [answer])])

    def night(*outcomes: DocOutcome) -> BatchReport:
        report = BatchReport()
        docs = [o.doc for o in outcomes]
        store.upsert(build_batch(list(outcomes), "m", known_people(store, docs), report,
                                 people=people_named(store)))
        mark(store, *(d.id for d in docs))
        return report

    night(DocOutcome(contacts))
    assert store.query("MATCH (p:Person) RETURN p.key AS k, p.namesake_of AS of ORDER BY k") \
        == [{"k": "Person:john smith", "of": None}, {"k": north, "of": "Person:john smith"}]
    report = night(
        research("b.md", "John Smith of Northwind Analytics met Ada Lovelace.",
                 [("John Smith", "Person"), ("Northwind Analytics", "Organization"),
                  ("Ada Lovelace", "Person")]),
        research("d.md", "John Smith met Ada Lovelace.",
                 [("John Smith", "Person"), ("Ada Lovelace", "Person")]))
    assert report.namesakes_linked == 1
    assert report.unlinked == [UnlinkedMention(
        document="research/d.md", name="John Smith",
        candidates=["Person:john smith", north], relationships=1)]
    facts = store.query("MATCH (p:Person)-[r:RELATED_TO]->(q:Person) "
                        "RETURN p.key AS p, q.key AS q, r.doc_ids AS docs")
    assert facts == [{"p": north, "q": "Person:ada lovelace", "docs": ["research/b.md"]}]
    seen = store.query("MATCH (p:Person)-[:MENTIONED_IN]->(d:Document) "
                       "RETURN p.key AS p, d.id AS d ORDER BY p, d")
    assert seen == [{"p": "Person:ada lovelace", "d": "research/b.md"},
                    {"p": "Person:ada lovelace", "d": "research/d.md"},
                    {"p": "Person:john smith", "d": "contacts/a.json"},
                    {"p": north, "d": "contacts/a.json"},
                    {"p": north, "d": "research/b.md"}]


def test_a_phone_a_person_of_its_name_holds_joins_a_new_address_on_both_stores(
        store: GraphStore) -> None:
    """Issue 52, item 1, phones, through the real store and phase 1's lookups: the graph holds
    John Smith of Contoso and his Northwind namesake, each with a phone. A John Smith with a
    new address and Contoso's number, written another way, is the first one (a second
    address), not a third; one with no address and the namesake's number is the namesake; one
    with a new address and a number nobody holds is a namesake of its own; a Jane Smith with
    John's number stays Jane (a phone never joins two names). A note that gives the namesake's
    number is his. Each join is recorded with the phone as written."""
    from tasks.extraction.answers import BatchReport, build_batch
    from tasks.extraction.batch import known_people, people_named
    from tasks.extraction.calls import ChunkAnswer, DocOutcome
    from tasks.extraction.chunking import Chunk
    from tasks.extraction.documents import Document
    from tasks.extraction.schema import Extraction

    john, north = "Person:john smith", "Person:john smith <jsmith@northwind.example>"

    def contacts(doc_id: str, *people: tuple[str, str | None, str]) -> Document:
        records = [{"name": n, "title": "", "emails": [e] if e else [], "phones": [p],
                    "organization": ""} for n, e, p in people]
        return Document(doc_id, "contacts", f"/x/{doc_id}", "h", "", {}, records)

    def night(*outcomes: DocOutcome) -> BatchReport:
        report = BatchReport()
        docs = [o.doc for o in outcomes]
        batch = build_batch(list(outcomes), "m", known_people(store, docs), report,
                            people=people_named(store))
        store.upsert(batch)
        mark(store, *(d.id for d in docs))
        return report

    night(DocOutcome(contacts("contacts/a.json",
                              ("John Smith", "john.smith@contoso.com", "+1 (555) 010-0100"),
                              ("John Smith", "jsmith@northwind.example", "+44 20 7946 0958"))))
    report = night(DocOutcome(contacts(
        "contacts/b.json",
        ("John Smith", "john@home.example", "555.010.0100"),
        ("John Smith", None, "020 7946 0958"),
        ("John Smith", "jsmith@fabrikam.example", "555 019 9999"),
        ("Jane Smith", "jane@contoso.com", "(555) 010-0100"))))
    people = {r["k"]: (sorted(r["e"]), sorted(r["p"])) for r in store.query(
        "MATCH (p:Person) RETURN p.key AS k, p.emails AS e, p.phones AS p")}
    assert people == {
        john: (["john.smith@contoso.com", "john@home.example"],
               ["+1 (555) 010-0100", "555.010.0100"]),
        north: (["jsmith@northwind.example"], ["+44 20 7946 0958", "020 7946 0958"]),
        "Person:john smith <jsmith@fabrikam.example>": (["jsmith@fabrikam.example"],
                                                        ["555 019 9999"]),
        "Person:jane smith": (["jane@contoso.com"], ["(555) 010-0100"])}
    assert (report.joins, report.namesakes_apart) == ({"phone": 2}, 1)
    assert sorted((j["key"], j["form"], j["evidence"], j["document"])
                  for j in store.merges()) == [
        (john, "John Smith", "phone 555.010.0100", "contacts/b.json"),
        (north, "John Smith", "phone 020 7946 0958", "contacts/b.json")]

    text = "Call John Smith on 020-7946-0958 about Ada Lovelace."
    note = Document("research/n.md", "research", "/x/n.md", "h", text, {})
    answer = Extraction.model_validate({
        "entities": [{"name": n, "type": "Person", "description": ""}
                     for n in ("John Smith", "Ada Lovelace")],
        "relationships": [{"source": "John Smith", "type": "RELATED_TO",
                           "target": "Ada Lovelace", "description": ""}]})
    report = night(DocOutcome(note, [ChunkAnswer(Chunk(0, 0, len(text), text), [answer])]))
    assert (report.namesakes_linked, report.unlinked) == (1, [])
    assert store.query("MATCH (p:Person)-[:RELATED_TO]->(q:Person) RETURN p.key AS p, "
                       "q.key AS q") == [{"p": north, "q": "Person:ada lovelace"}]
    assert [(j["key"], j["evidence"]) for j in store.merges() if j["document"] ==
            "research/n.md"] == [(north, "phone 79460958 in the text")]


def test_a_nickname_at_the_same_employer_joins_and_is_listed_on_both_stores(
        store: GraphStore) -> None:
    """Issue 52, item 2, through the real store and phase 1's lookups (colleagues_of): Robert
    Smith and William Jones of Contoso in the graph; a later contact list without addresses
    names "Bob Smith" at Contoso Ltd (Robert: one Person, the nickname as an alias, the join
    listed with its evidence) and "Bill Jones" at Northwind (not William: the employer does not
    agree)."""
    from tasks.extraction.answers import BatchReport, build_batch
    from tasks.extraction.batch import colleagues_of, known_people, people_named
    from tasks.extraction.calls import DocOutcome
    from tasks.extraction.documents import Document

    def contacts(doc_id: str, *people: tuple[str, str, str | None]) -> Document:
        records = [{"name": n, "title": "", "emails": [e] if e else [], "phones": [],
                    "organization": o} for n, o, e in people]
        return Document(doc_id, "contacts", f"/x/{doc_id}", "h", "", {}, records)

    def night(doc: Document) -> BatchReport:
        report = BatchReport()
        store.upsert(build_batch([DocOutcome(doc)], "m", known_people(store, [doc]), report,
                                 people=people_named(store), colleagues=colleagues_of(store)))
        mark(store, doc.id)
        return report

    night(contacts("contacts/a.json", ("Robert Smith", "Contoso", "rs@contoso.example"),
                   ("William Jones", "Contoso", "wj@contoso.example")))
    report = night(contacts("contacts/b.json", ("Bob Smith", "Contoso Ltd", None),
                            ("Bill Jones", "Northwind Analytics", None)))
    assert report.joins == {"nickname": 1}
    people = {r["k"]: (r["n"], r["a"]) for r in store.query(
        "MATCH (p:Person) RETURN p.key AS k, p.name AS n, p.aliases AS a")}
    assert people == {"Person:robert smith": ("Robert Smith", ["Bob Smith"]),
                      "Person:william jones": ("William Jones", []),
                      "Person:bill jones": ("Bill Jones", [])}
    assert [(j["key"], j["form"], j["evidence"], j["document"]) for j in store.merges()] == [
        ("Person:robert smith", "Bob Smith",
         "nickname of Robert Smith, employer Organization:contoso", "contacts/b.json")]
    works = sorted((r["p"], r["o"], r["d"]) for r in store.query(
        "MATCH (p:Person)-[w:WORKS_FOR]->(o:Organization) RETURN p.key AS p, o.key AS o, "
        "w.doc_ids AS d"))
    assert works == [
        ("Person:bill jones", "Organization:northwind analytics", ["contacts/b.json"]),
        ("Person:robert smith", "Organization:contoso", ["contacts/a.json", "contacts/b.json"]),
        ("Person:william jones", "Organization:contoso", ["contacts/a.json"])]
