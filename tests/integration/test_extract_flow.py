"""Phase 1 end to end through Prefect, against the fake endpoint and a real FalkorDB."""

import json
from collections import Counter
from pathlib import Path

import pytest

from flows.extract import extract
from tasks.graph.falkordb_store import FalkorDBStore
from tasks.graph.neo4j_local import LocalNeo4j
from tasks.graph.neo4j_store import Neo4jStore
from tasks.shared.errors import PhaseFailed
from tests.fakes.openai_server import FakeOpenAI
from tests.support.documents import transcript
from tests.support.graph_dump import dump
from tests.support.neo4j import empty_neo4j
from tests.support.profiles import extraction_profile

pytestmark = pytest.mark.usefixtures("prefect_api")


@pytest.fixture
def setup(tmp_path: Path, falkordb: int, fake_llm: FakeOpenAI, request: pytest.FixtureRequest):
    """The documents and a profile on FalkorDB, or on Neo4j where a test is parametrized with
    `setup` = "neo4j" (indirect): the whole of phase 1 on the production store."""
    graph = "f_" + request.node.name[:40].replace("[", "_").replace("]", "_").replace("-", "_")
    src = tmp_path / "docs"
    neo4j: LocalNeo4j | None = None
    table = None
    if getattr(request, "param", "falkordb") == "neo4j":
        neo4j = request.getfixturevalue("neo4j_server")
        empty_neo4j(neo4j).close()
        table = {"type": "neo4j", "uri": neo4j.uri, "user": neo4j.user,
                 "password": neo4j.password, "database": neo4j.database, "batch_size": 5}
    profile = extraction_profile(tmp_path, base_url=fake_llm.url, falkordb_port=falkordb,
                                 graph=graph, sources=src, graph_table=table)
    (src / "transcripts" / "a.md").write_text(transcript(["Ann Lee", "Bob Stone"]))
    (src / "transcripts" / "b.md").write_text(transcript(["Cy Young", "Bob Stone"]))
    (src / "transcripts" / "c.md").write_text(transcript(["Hon. Dee Ray (Minister of Things)",
                                                          "Hon. Dee Ray"]))
    (src / "research" / "r.yaml").write_text("title: Briefing\nsummary: Ann Lee joined Acme Corp.\n")
    (src / "contacts" / "c.json").write_text(json.dumps([
        {"name": "Ann Lee", "emails": ["ann@acme.test"], "organization": "Acme Corp",
         "title": "CTO", "notes": "Introduced by Bob Stone."},
        {"name": "A. Lee", "emails": ["ANN@acme.test"]},
    ]))
    if neo4j is not None:
        with Neo4jStore(neo4j.uri, neo4j.user, neo4j.password) as n4j:
            yield profile, src, n4j, fake_llm
        return
    store = FalkorDBStore("127.0.0.1", falkordb, graph)
    yield profile, src, store, fake_llm
    try:
        store._graph.delete()
    except Exception:  # noqa: BLE001
        pass


BOTH = pytest.mark.parametrize("setup", ["falkordb", "neo4j"], indirect=True)


@BOTH
def test_three_streams_into_the_graph_with_provenance(setup) -> None:
    profile, src, store, fake = setup
    s = extract(profile=str(profile)).model_dump(mode="json")
    assert s["documents"] == {
        "transcripts": {"seen": 3, "extracted": 3, "skipped": 0, "failed": 0},
        "research": {"seen": 1, "extracted": 1, "skipped": 0, "failed": 0},
        "contacts": {"seen": 1, "extracted": 1, "skipped": 0, "failed": 0},
    }
    assert s["llm_calls"] == fake.calls == 5  # contacts: one call for the notes
    rows = store.query("MATCH (p:Person {key: 'Person:ann lee'})-[:MENTIONED_IN]->(d:Document) "
                       "RETURN d.id AS id ORDER BY id")
    assert [r["id"] for r in rows] == ["contacts/c.json", "research/r.yaml", "transcripts/a.md"]
    # contacts unify by e-mail; the second spelling is an alias
    ann = store.query("MATCH (p:Person {key: 'Person:ann lee'}) RETURN p.emails AS e, "
                      "p.aliases AS a")[0]
    assert ann["e"] == ["ann@acme.test"] and "A. Lee" in ann["a"]
    assert store.query("MATCH (:Person {key:'Person:ann lee'})-[r:WORKS_FOR]->(o:Organization) "
                       "RETURN o.name AS o, r.description AS t") == [{"o": "Acme Corp", "t": "CTO"}]
    # the same person with and without affiliation: one node, aliases kept
    dee = store.query("MATCH (p:Person) WHERE p.name = 'Dee Ray' RETURN p.aliases AS a, "
                      "p.affiliation AS aff")
    assert len(dee) == 1 and dee[0]["aff"] == "Minister of Things"
    assert sorted(dee[0]["a"]) == ["Hon. Dee Ray", "Hon. Dee Ray (Minister of Things)"]


@BOTH
def test_incremental_rerun_edit_and_delete(setup) -> None:
    profile, src, store, fake = setup
    extract(profile=str(profile))
    first = dump(store)
    fake.reset()

    s = extract(profile=str(profile)).model_dump(mode="json")  # nothing changed
    assert fake.calls == 0 and s["llm_calls"] == 0
    assert sum(c["skipped"] for c in s["documents"].values()) == 5
    assert dump(store) == first

    # edit b.md: Cy Young is replaced by Eve Park → one call, Cy's relationship gone
    (src / "transcripts" / "b.md").write_text(transcript(["Eve Park", "Bob Stone"]))
    s = extract(profile=str(profile)).model_dump(mode="json")
    assert fake.calls == 1
    assert s["documents"]["transcripts"] == {"seen": 3, "extracted": 1, "skipped": 2, "failed": 0}
    names = {r["n"] for r in store.query("MATCH (p:Person) RETURN p.name AS n")}
    assert "Cy Young" not in names and "Eve Park" in names
    bob = store.query("MATCH (:Person {name:'Bob Stone'})-[r:PARTICIPATED_IN]->(e:Event) "
                      "RETURN r.doc_ids AS d")
    assert sorted(x for r in bob for x in r["d"]) == ["transcripts/a.md", "transcripts/b.md"]
    assert s["pruned"] >= 1

    # delete a.md: its provenance goes, Ann stays (research + contacts mention her)
    fake.reset()
    (src / "transcripts" / "a.md").unlink()
    s = extract(profile=str(profile)).model_dump(mode="json")
    assert fake.calls == 0 and s["deleted"] == 1
    docs = {r["id"] for r in store.query("MATCH (d:Document) RETURN d.id AS id")}
    assert "transcripts/a.md" not in docs
    rels = store.query("MATCH ()-[r]->() WHERE r.doc_ids IS NOT NULL AND "
                       "'transcripts/a.md' IN r.doc_ids RETURN count(r) AS n")
    assert rels[0]["n"] == 0
    ann_docs = store.query("MATCH (:Person {key:'Person:ann lee'})-[:MENTIONED_IN]->(d) "
                           "RETURN d.id AS id ORDER BY id")
    assert [r["id"] for r in ann_docs] == ["contacts/c.json", "research/r.yaml"]
    orphans = store.query("MATCH (e:Entity) WHERE NOT (e)-[:MENTIONED_IN]->() RETURN count(e) AS n")
    assert orphans[0]["n"] == 0

    # --full re-extracts everything
    fake.reset()
    extract(profile=str(profile), full=True)
    assert fake.calls == 4


def test_crash_mid_upsert_then_rerun_equals_a_clean_run(setup, falkordb: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    profile, src, store, fake = setup
    clean_profile = Path(str(profile).replace("profile.toml", "clean.toml"))
    clean_profile.write_text(profile.read_text().replace(f'graph_name = "{store._graph.name}"',
                                                         'graph_name = "clean_run"'))
    extract(profile=str(clean_profile))
    clean = FalkorDBStore("127.0.0.1", falkordb, "clean_run")
    expected = dump(clean)
    clean._graph.delete()

    real_write = FalkorDBStore._write
    calls = {"n": 0}

    def crashing_write(self, query, params=None):
        calls["n"] += 1
        if calls["n"] == 12:  # in the middle of the entity/relationship upserts
            raise KeyboardInterrupt("simulated crash")
        return real_write(self, query, params)

    monkeypatch.setattr(FalkorDBStore, "_write", crashing_write)
    with pytest.raises(BaseException, match="simulated crash"):
        extract(profile=str(profile))
    monkeypatch.setattr(FalkorDBStore, "_write", real_write)
    partial = dump(store)
    assert partial != expected
    extract(profile=str(profile))
    assert dump(store) == expected


def test_bad_inputs_are_counted_with_reasons_and_never_crash(setup) -> None:
    profile, src, store, fake = setup
    t = src / "transcripts"
    (t / "empty.md").write_text("")
    (t / "binary.md").write_bytes(b"\x00\x01\x02binary")
    (t / "latin1.md").write_bytes("caf\xe9".encode("latin-1"))
    (t / "huge.md").write_text("**A:** " + "word " * 2_100_000)
    (src / "research" / "bomb.yaml").write_text("a: &a [1,2]\nb: [*a, *a]\n")
    (src / "research" / "broken.yml").write_text("a: [1,\n")
    (src / "contacts" / "broken.json").write_text("{")
    s = extract(profile=str(profile)).model_dump(mode="json")
    assert s["documents"]["transcripts"] == {"seen": 7, "extracted": 3, "skipped": 0, "failed": 4}
    assert s["documents"]["research"]["failed"] == 2
    assert s["documents"]["contacts"]["failed"] == 1
    reasons = {f["id"]: f["message"] for f in s["failures"]}
    assert "empty file" in reasons["transcripts/empty.md"]
    assert "binary" in reasons["transcripts/binary.md"]
    assert "UTF-8" in reasons["transcripts/latin1.md"]
    assert "too large" in reasons["transcripts/huge.md"]
    assert "aliases" in reasons["research/bomb.yaml"]
    assert "malformed JSON" in reasons["contacts/broken.json"]
    lines = Path(s["dead_letter"]).read_text().splitlines()
    rec = json.loads(lines[0])
    assert set(rec) >= {"id", "path", "stream", "hash", "error", "message", "attempts", "time"}
    assert len(lines) == 7


def test_llm_failures_dead_letter_then_hold_and_share_gate(setup, tmp_path: Path) -> None:
    profile, src, store, fake = setup
    (src / "transcripts" / "bad.md").write_text(transcript(["Zed Zulu"], "FAULT:500x99"))
    s = extract(profile=str(profile)).model_dump(mode="json")
    failed = [f for f in s["failures"] if f["id"] == "transcripts/bad.md"]
    assert failed and failed[0]["error"] == "LLMError" and failed[0]["attempts"] == 4
    fake.reset()
    s = extract(profile=str(profile)).model_dump(mode="json")  # unchanged since it failed: held, no calls
    assert fake.calls == 0
    assert s["documents"]["transcripts"]["failed"] == 1
    assert "retry-failed" in s["failures"][0]["message"]
    # a share above the limit fails the phase, after reporting
    strict = tmp_path / "strict.toml"
    strict.write_text(profile.read_text().replace("max_failed_share = 1.0",
                                                  "max_failed_share = 0.1"))
    with pytest.raises(PhaseFailed, match="1 of 1 documents failed") as e:
        extract(profile=str(strict), retry_failed=True)
    assert e.value.report.documents["transcripts"].failed == 1


def test_an_unreachable_endpoint_fails_documents_without_holding_them(setup,
                                                                     tmp_path: Path) -> None:
    """A node that went away (connection refused) is not the documents' fault: they are
    counted and dead-lettered, but the next run does them without --retry-failed."""
    from tasks.shared.processes import free_port

    profile, src, store, fake = setup
    down = tmp_path / "down.toml"
    down.write_text(profile.read_text().replace(fake.url, f"http://127.0.0.1:{free_port()}"))
    s = extract(profile=str(down)).model_dump(mode="json")
    llm_failed = [f for f in s["failures"] if f["error"] == "LLMError"]
    assert len(llm_failed) == 5 and all(  # every document has text for the model
        "ConnectError" in f["message"] and "retried on the next run" in f["message"]
        for f in llm_failed)
    fake.reset()
    s = extract(profile=str(profile)).model_dump(mode="json")  # the endpoint is back: no hold, no flag needed
    assert s["failures"] == [] and fake.calls > 0
    assert sum(c["extracted"] for c in s["documents"].values()) == 5


def test_labels_outside_the_schema_are_mapped_or_rejected_and_counted(setup) -> None:
    profile, src, store, fake = setup
    for p in src.rglob("*.*"):
        p.unlink()
    # the fake answers "Enterprise Ship" (a Spaceship) and "Acme Corp" (a company); the text
    # names acme corp (in lower case, so the fake's own name finder skips it) but no ship
    (src / "transcripts" / "x.md").write_text(transcript(["Ann Lee"], "She works at acme corp. "
                                                                      "FAULT:badlabels"))
    s = extract(profile=str(profile)).model_dump(mode="json")
    assert s["rejected_entity_types"] == {"Spaceship": 1}
    assert s["quality"]["ungrounded"] == []  # the ship was rejected before its name was read
    assert s["remapped_relationship_types"] == {"LOVES": 1}
    orgs = store.query("MATCH (o:Organization) RETURN o.name AS n")
    assert orgs == [{"n": "Acme Corp"}]  # "company" mapped to Organization
    assert store.query("MATCH ()-[r:RELATED_TO]->(o:Organization) RETURN count(r) AS n") == [{"n": 1}]


def test_graph_hiccup_retries_the_writes_not_the_llm_calls(setup, monkeypatch) -> None:
    import tasks.extraction.batch as ex
    from tasks.shared.errors import GraphError

    profile, src, store, fake = setup
    monkeypatch.setattr(ex, "GRAPH_RETRY_SECONDS", 0.01)
    real = FalkorDBStore.upsert
    fails = {"n": 2}

    def flaky(self, batch):
        if fails["n"]:
            fails["n"] -= 1
            raise GraphError("connection reset")
        return real(self, batch)

    monkeypatch.setattr(FalkorDBStore, "upsert", flaky)
    s = extract(profile=str(profile)).model_dump(mode="json")
    assert fails["n"] == 0 and s["llm_calls"] == fake.calls == 5
    assert sum(c["extracted"] for c in s["documents"].values()) == 5


def test_a_bad_record_is_listed_every_run_and_the_file_keeps_the_others(setup) -> None:
    profile, src, store, fake = setup
    (src / "contacts" / "c.json").write_text(json.dumps([
        {"name": "Ann Lee", "emails": ["ann@acme.test"], "organization": "Acme Corp",
         "title": "CTO", "notes": "Introduced by Bob Stone."},
        {"name": "", "emails": ["nobody@acme.test"]},
        {"name": "A. Lee", "emails": ["ANN@acme.test"]},
    ]))
    s = extract(profile=str(profile)).model_dump(mode="json")
    assert s["documents"]["contacts"] == {"seen": 1, "extracted": 1, "skipped": 0, "failed": 0}
    assert s["bad_records"] == {"contacts": 1}
    bad = [f for f in s["failures"] if f["id"] == "contacts/c.json#1"]
    assert len(bad) == 1 and bad[0]["error"] == "RecordError" and bad[0]["record"] == 1
    assert "record 1: field 'name'" in bad[0]["message"]
    ann = store.query("MATCH (p:Person {key: 'Person:ann lee'}) RETURN p.aliases AS a")
    assert ann and "A. Lee" in ann[0]["a"]  # the records after the bad one are kept too
    assert store.query("MATCH (p:Person) WHERE p.name = '' RETURN count(p) AS n") == [{"n": 0}]

    fake.reset()
    # unchanged: skipped, and the bad record listed again
    s = extract(profile=str(profile)).model_dump(mode="json")
    assert fake.calls == 0 and s["documents"]["contacts"]["skipped"] == 1
    assert [f["id"] for f in s["failures"]] == ["contacts/c.json#1"]
    lines = [json.loads(x) for x in Path(s["dead_letter"]).read_text().splitlines()]
    assert [x["id"] for x in lines] == ["contacts/c.json#1"] * 2

    (src / "contacts" / "c.json").write_text(json.dumps([{"name": "Ann Lee"}]))  # fixed
    s = extract(profile=str(profile)).model_dump(mode="json")
    assert s["failures"] == [] and s["bad_records"] == {}
    assert s["documents"]["contacts"]["extracted"] == 1


def meeting(title: str, names: list[str], fault: str = "") -> str:
    people = "\n".join(f'  - "{n}"' for n in names)
    return (f"---\nmeeting_id: {title}\nparticipants:\n{people}\n---\n# {title}\n\n"
            f"**Chair:** {' and '.join(names)} spoke. {fault}\n")


def test_a_hostile_endpoint_leaves_only_bounded_valid_answers(setup) -> None:
    """Floods, unknown fields, think blocks, truncated JSON, 500s and stalls: the graph gets
    only answers within the schema's bounds, and every good record of every file."""
    from tasks.extraction.inputs import response_schema
    from tasks.extraction.stages import markdown_report
    from tasks.profile import load_profile

    profile, src, store, fake = setup
    schema = response_schema(load_profile(str(profile)).inference)
    max_entities = schema["properties"]["entities"]["maxItems"]
    max_name = schema["properties"]["entities"]["items"]["properties"]["name"]["maxLength"]
    for p in src.rglob("*.*"):
        p.unlink()
    t = src / "transcripts"
    (t / "ok.md").write_text(meeting("Alpha", ["Ann Lee", "Bob Stone"]))
    (t / "flood.md").write_text(meeting("Beta", ["Cy Young"], "FAULT:flood"))
    (t / "greedy.md").write_text(meeting("Gamma", ["Dee Ray", "Eve Park"], "FAULT:greedyflood"))
    (t / "extra.md").write_text(meeting("Delta", ["Fay Wu", "Gus Hale"], "FAULT:extrafield"))
    (t / "think.md").write_text(meeting("Epsilon", ["Hal Ito", "Ida Moss"], "FAULT:think"))
    (t / "trunc.md").write_text(meeting("Zeta", ["Jo King"], "FAULT:truncated"))
    (t / "err.md").write_text(meeting("Eta", ["Kai Long", "Lu Chen"], "FAULT:500x2"))
    (t / "slow.md").write_text(meeting("Theta", ["Max Ford", "Ned Hill"], "FAULT:slowx1"))
    (t / "long.md").write_text(meeting("Iota", ["Ola Berg"], "FAULT:longname"))
    (src / "contacts" / "people.json").write_text(json.dumps([
        {"name": "Pia Holm", "emails": ["pia@acme.test"], "organization": "Acme Corp",
         "notes": "Met at the expo with Ann Lee."},
        {"name": ""}, {"name": "Quinn Ash", "emails": ["not-an-address"]},
        {"name": "Rex Dale"}]))
    (src / "contacts" / "allbad.json").write_text(json.dumps([{"name": ""}, 3]))
    (src / "research" / "r.yaml").write_text(
        "- title: Briefing\n  summary: Sam Vale joined the board.\n- 42\n"
        "- title: Update\n  summary: Tia Ross left.\n")

    typed = extract(profile=str(profile))
    s = typed.model_dump(mode="json")
    assert s["documents"] == {
        "transcripts": {"seen": 9, "extracted": 6, "skipped": 0, "failed": 3},
        "research": {"seen": 1, "extracted": 1, "skipped": 0, "failed": 0},
        "contacts": {"seen": 2, "extracted": 1, "skipped": 0, "failed": 1},
    }
    reasons = {f["id"]: f["message"] for f in s["failures"]}
    assert sorted(reasons) == ["contacts/allbad.json", "contacts/people.json#1",
                               "contacts/people.json#2", "research/r.yaml#1",
                               "transcripts/flood.md", "transcripts/long.md",
                               "transcripts/trunc.md"]
    assert f"entities: 3000 items > maxItems {max_entities}" in reasons["transcripts/flood.md"]
    assert f"characters > maxLength {max_name}" in reasons["transcripts/long.md"]
    assert "malformed response" in reasons["transcripts/trunc.md"]
    assert "every record is bad" in reasons["contacts/allbad.json"]
    assert s["unusable_answers"] == {"entities: maxItems": 5, "not JSON": 4,
                                     "entities[].name: maxLength": 4}
    assert s["dropped_fields"] == {"confidence": 1, "entities[].confidence": 2,
                                   "relationships[].evidence": 1}
    assert s["bad_records"] == {"contacts": 2, "research": 1}

    # Exactly what the good answers and good records hold (the fake: every capitalised
    # two-word name is a Person, the first linked to the rest by RELATED_TO).
    names = {r["n"]: r["t"] for r in store.query(
        "MATCH (e:Entity) RETURN e.name AS n, e.type AS t")}
    people = ["Ann Lee", "Bob Stone", "Dee Ray", "Eve Park", "Fay Wu", "Gus Hale", "Hal Ito",
              "Ida Moss", "Kai Long", "Lu Chen", "Max Ford", "Ned Hill", "Pia Holm", "Rex Dale",
              "Sam Vale", "Tia Ross"]
    events = ["Alpha", "Gamma", "Delta", "Epsilon", "Eta", "Theta"]
    assert names == {**dict.fromkeys(people, "Person"), **dict.fromkeys(events, "Event"),
                     "Acme Corp": "Organization"}
    assert all(len(n) <= max_name for n in names)
    rels = Counter(r["t"] for r in store.query(
        "MATCH (:Entity)-[r]->(:Entity) RETURN type(r) AS t"))
    assert rels == {"PARTICIPATED_IN": 12, "RELATED_TO": 8, "WORKS_FOR": 1}
    report = markdown_report(typed, [])
    assert "'entities: maxItems': 5" in report and "'entities[].confidence': 2" in report
    assert "| contacts/people.json#1 | RecordError |" in report

    # unchanged next run: good documents skipped, failed ones held, bad records listed again
    fake.reset()
    before = dump(store)
    s = extract(profile=str(profile)).model_dump(mode="json")
    assert fake.calls == 0 and dump(store) == before
    assert {f["id"] for f in s["failures"]} == set(reasons)


def two_smiths(src: Path) -> None:
    """Only a contacts file of two John Smiths, one at Contoso, one at Northwind, each with
    their own address."""
    for p in src.rglob("*.*"):
        p.unlink()
    (src / "contacts" / "smiths.json").write_text(json.dumps([
        {"name": "John Smith", "emails": ["john.smith@contoso.test"], "organization": "Contoso"},
        {"name": "John Smith", "emails": ["jsmith@northwind.test"], "organization": "Northwind"}]))


@BOTH
def test_phase_1_links_a_name_alone_to_the_namesake_its_document_fits_and_lists_the_rest(
        setup) -> None:
    """Issue 52, the whole of phase 1: two contacts named John Smith with their own addresses
    are two Persons; a note that gives the second one's address is his; a note that names John
    Smith alone is linked to neither, its fact left out, and the report lists it. The next run
    changes nothing."""
    from tasks.extraction.stages import markdown_report

    profile, src, store, fake = setup
    two_smiths(src)
    (src / "research" / "mail.md").write_text(
        "# Mail\n\nJohn Smith (jsmith@northwind.test) wrote to Ada Lovelace.\n")
    (src / "research" / "alone.md").write_text("# Alone\n\nJohn Smith met Ada Lovelace.\n")
    typed = extract(profile=str(profile))
    north = "Person:john smith <jsmith@northwind.test>"
    assert typed.namesakes_linked == 1
    assert [u.model_dump() for u in typed.unlinked_people] == [{
        "document": "research/alone.md", "name": "John Smith", "relationships": 1,
        "candidates": ["Person:john smith", north], "judge": ""}]
    facts = store.query("MATCH (p:Person)-[r:RELATED_TO]->(q:Person) "
                        "RETURN p.key AS p, q.key AS q, r.doc_ids AS docs")
    assert facts == [{"p": north, "q": "Person:ada lovelace", "docs": ["research/mail.md"]}]
    report = markdown_report(typed, [])
    assert ("| research/alone.md | John Smith | Person:john smith, Person:john smith "
            "<jsmith@northwind.test> | 1 | — |") in report
    fake.reset()
    before = dump(store)
    again = extract(profile=str(profile))
    assert fake.calls == 0 and dump(store) == before and again.unlinked_people == []


@BOTH
def test_graph_merges_lists_each_join_and_graph_split_undoes_it_for_good(
        setup, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 52, item 3, on both stores: a contact's second spelling joined by its address,
    and a name alone joined to the namesake whose address its note gives, are listed with
    their evidence. Splitting the second retracts its note at once (its fact goes); the next
    run extracts the note again and links the name to no one, and the run after changes
    nothing."""
    from flows.cli import main

    profile, src, store, fake = setup
    for p in src.rglob("*.*"):
        p.unlink()
    (src / "contacts" / "people.json").write_text(json.dumps([
        {"name": "John Smith", "emails": ["john.smith@contoso.test"], "organization": "Contoso"},
        {"name": "John Smith", "emails": ["jsmith@northwind.test"], "organization": "Northwind"},
        {"name": "J. Smith", "emails": ["JSmith@northwind.test"]}]))
    (src / "research" / "mail.md").write_text(
        "# Mail\n\nJohn Smith (jsmith@northwind.test) wrote to Ada Lovelace.\n")
    extract(profile=str(profile))
    north = "Person:john smith <jsmith@northwind.test>"
    capsys.readouterr()
    assert main(["graph", "merges", "--profile", str(profile), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted((j["key"], j["form"], j["evidence"], j["document"])
                  for j in listed["joins"]) == [
        (north, "J. Smith", "e-mail jsmith@northwind.test", "contacts/people.json"),
        (north, "John Smith", "e-mail jsmith@northwind.test in the text", "research/mail.md")]
    assert listed["splits"] == []

    assert main(["graph", "split", north, "john SMITH", "--profile", str(profile)]) == 0
    said = capsys.readouterr().out
    assert "1 document(s) retracted" in said and "  research/mail.md" in said
    assert store.query("MATCH (:Person)-[r:RELATED_TO]->() RETURN count(r) AS n") == [{"n": 0}]
    with pytest.raises(Exception, match="no join of \\['nobody'\\] to it — its joined forms are "
                       "\\['J. Smith'\\]"):
        store.split(north, ["Nobody"])

    fake.reset()
    again = extract(profile=str(profile))
    assert fake.calls == 1  # the note, again; the contacts are unchanged
    assert [u.model_dump() for u in again.unlinked_people] == [{
        "document": "research/mail.md", "name": "John Smith", "relationships": 1,
        "candidates": ["Person:john smith"], "judge": ""}]
    assert store.query("MATCH (:Person)-[r:RELATED_TO]->() RETURN count(r) AS n") == [{"n": 0}]
    assert [(j["form"], j["document"]) for j in store.merges()] == [
        ("J. Smith", "contacts/people.json")]
    assert main(["graph", "merges", "--profile", str(profile)]) == 0
    assert f"split: 'john smith' is kept apart from {north}" in capsys.readouterr().out
    fake.reset()
    before = dump(store)
    extract(profile=str(profile))
    assert fake.calls == 0 and dump(store) == before


@BOTH
def test_the_judge_links_what_the_evidence_leaves_open_and_its_join_is_listed_and_split(
        setup, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 52, item 4, through phase 1 on both stores with `[extraction] judge = true`: a
    note that names John Smith at the Contoso office (no organization the model wrote, no
    address) goes to the fake's judge, which links it to the Contoso John Smith; `graph
    merges` lists the join with the judge's reasons. A note that gives the judge nothing is
    linked to no one, listed with its reasons. Split, the note is asked again and linked to no
    one; the run after changes nothing."""
    from flows.cli import main

    profile, src, store, fake = setup
    profile.write_text(profile.read_text() + "judge = true\n")
    two_smiths(src)
    (src / "research" / "office.md").write_text(
        "# Office\n\nJohn Smith met Ada Lovelace at the Contoso office.\n")
    (src / "research" / "alone.md").write_text("# Alone\n\nJohn Smith met Ada Lovelace.\n")
    typed = extract(profile=str(profile))
    john, north = "Person:john smith", "Person:john smith <jsmith@northwind.test>"
    reasons = f"The passages mention contoso, which only {john} is tied to."
    asked = [r["messages"][1]["content"].split("\n")[1] for r in fake.requests
             if r["messages"][1]["content"].startswith("Name: ")]
    assert asked == ["Document: research/alone.md", "Document: research/office.md"]
    assert typed.llm_calls == 4  # the two notes, and the judge twice
    assert [u.model_dump() for u in typed.unlinked_people] == [{
        "document": "research/alone.md", "name": "John Smith", "relationships": 1,
        "candidates": [john, north],
        "judge": "The passages name no employer or address that tells them apart."}]
    facts = store.query("MATCH (p:Person)-[r:RELATED_TO]->(q:Person) "
                        "RETURN p.key AS p, q.key AS q, r.doc_ids AS docs")
    assert facts == [{"p": john, "q": "Person:ada lovelace", "docs": ["research/office.md"]}]
    capsys.readouterr()
    assert main(["graph", "merges", "--profile", str(profile), "--json"]) == 0
    assert [(j["key"], j["form"], j["evidence"], j["document"])
            for j in json.loads(capsys.readouterr().out)["joins"]] == [
        (john, "John Smith", f"judge: {reasons}", "research/office.md")]

    assert main(["graph", "split", john, "John Smith", "--profile", str(profile)]) == 0
    fake.reset()
    again = extract(profile=str(profile))
    assert fake.calls == 2  # the note, and the judge of its one candidate left: none
    assert [(u.document, u.candidates, u.judge) for u in again.unlinked_people] == [
        ("research/office.md", [north],
         "The passages name no employer or address that tells them apart.")]
    assert store.query("MATCH (:Person)-[r:RELATED_TO]->() RETURN count(r) AS n") == [{"n": 0}]
    fake.reset()
    before = dump(store)
    extract(profile=str(profile))
    assert fake.calls == 0 and dump(store) == before


def test_one_edited_type_description_re_extracts_exactly_what_the_model_reads(setup) -> None:
    """The extraction version comes from the schema file: edit one description and the
    documents whose text the model reads are extracted again, the contact records it never
    reads are not, and the run says why."""
    from tasks.graph.ontology import DEFAULT_SCHEMA

    profile, src, store, fake = setup
    schema = profile.parent / "graph.toml"
    schema.write_text(DEFAULT_SCHEMA.read_text())
    profile.write_text(profile.read_text() + f'schema = "{schema}"\n')
    (src / "contacts" / "plain.json").write_text(json.dumps(
        {"name": "Eve Park", "emails": ["eve@acme.test"], "organization": "Acme Corp"}))
    first = extract(profile=str(profile)).model_dump(mode="json")
    assert sum(c["extracted"] for c in first["documents"].values()) == 6
    assert extract(profile=str(profile)).llm_calls == 0  # unchanged: nothing asked
    schema.write_text(schema.read_text().replace(
        'description = "A named product, device, tool or piece of software."',
        'description = "A named product or service sold to customers."'))
    fake.reset()
    again = extract(profile=str(profile)).model_dump(mode="json")
    assert again["documents"] == {
        "transcripts": {"seen": 3, "extracted": 3, "skipped": 0, "failed": 0},
        "research": {"seen": 1, "extracted": 1, "skipped": 0, "failed": 0},
        # c.json has notes the model reads; plain.json is records only
        "contacts": {"seen": 2, "extracted": 1, "skipped": 1, "failed": 0},
    }
    assert again["llm_calls"] == fake.calls == 5
    assert again["quality"]["extraction_version"] != first["quality"]["extraction_version"]
    versions = {r["id"]: r["v"] for r in store.query(
        "MATCH (d:Document) RETURN d.id AS id, d.prompt_version AS v")}
    assert versions["contacts/plain.json"].startswith("d5-")
    assert versions["transcripts/a.md"] == again["quality"]["extraction_version"]
    # the graph is the same graph: Eve still works for Acme, Ann's provenance intact
    assert store.query("MATCH (:Person {key: 'Person:eve park'})-[:WORKS_FOR]->(o) "
                       "RETURN o.name AS o") == [{"o": "Acme Corp"}]


def test_the_graph_gives_the_text_behind_a_fact(setup, capsys) -> None:
    from flows.cli import main

    profile, src, store, fake = setup
    extract(profile=str(profile))
    ann = store.evidence("Person:ann lee")
    # the model named her in the contacts' notes, the research note and one transcript
    assert [(r["document"], r["chunk"], r["start"]) for r in ann] == [
        ("contacts/c.json", 0, 0), ("research/r.yaml", 0, 0), ("transcripts/a.md", 0, 0)]
    assert all("Ann Lee" in r["text"] and r["end"] == len(r["text"]) for r in ann)
    rel = store.relationship_evidence("Person:ann lee", "RELATED_TO", "Person:bob stone")
    assert [r["document"] for r in rel] == ["contacts/c.json", "transcripts/a.md"]
    capsys.readouterr()
    assert main(["graph", "evidence", "Ann Lee", "--profile", str(profile)]) == 0
    out = capsys.readouterr().out
    assert "── research/r.yaml chunk 0" in out and "── transcripts/a.md chunk 0" in out
    assert main(["graph", "evidence", "Person:nobody", "--profile", str(profile)]) == 1
    assert "no entity 'Person:nobody'" in capsys.readouterr().err
