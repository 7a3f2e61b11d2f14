"""Issue 52, item 4: the judge's plumbing, with the real client against the fake endpoint (its
judge answers from what the prompt shows: tests/fakes/openai_server.py `judgement`). A name
alone the rules settle is never sent; one they leave open is, with its passages and each
candidate's evidence, under a schema that asks for the reasons before the answer; the link it
makes is a join with those reasons; "none" and an answer outside the candidates leave the name
linked to no one, listed with why. Exact values, worked out by hand."""

from __future__ import annotations

from tasks.extraction.answers import BatchReport, build_batch
from tasks.extraction.judge import Judge, passages
from tasks.extraction.llm import LLMClient
from tasks.records import UnlinkedMention
from tests.fakes.openai_server import FakeOpenAI
from tests.unit.extraction.test_namesakes import GRAPH, JOHN, NORTH, mentioned, research

DOCS = [
    # the rules: Contoso Ltd is among the document's organizations → John of Contoso, no judge
    ("a.md", "John Smith presented the roadmap of Contoso Ltd.",
     [("John Smith", "Person"), ("Contoso Ltd", "Organization")]),
    # no organization the model wrote, no address: the judge reads "Contoso" in the passage
    ("d.md", "John Smith met Ada Lovelace at the Contoso office.",
     [("John Smith", "Person"), ("Ada Lovelace", "Person")]),
    # both fit by the rules, and the passage mentions both employers: the judge says none
    ("e.md", "John Smith compared Contoso Ltd with Northwind Analytics.",
     [("John Smith", "Person"), ("Contoso Ltd", "Organization"),
      ("Northwind Analytics", "Organization")]),
    # an answer outside the candidates, again on the resend: no verdict
    ("f.md", "John Smith wrote this. FAULT:judgeoff",
     [("John Smith", "Person")]),
]


def people(names: set[str]) -> dict:
    return {JOHN: GRAPH} if JOHN in names else {}


def judged(fake: FakeOpenAI) -> list[dict]:
    return [r for r in fake.requests if r["messages"][1]["content"].startswith("Name: ")]


def test_the_judge_settles_what_the_rules_leave_open_and_lists_what_it_cannot() -> None:
    outcomes = [research(n, t, names, [("John Smith", "RELATED_TO", "Ada Lovelace")]
                         if n == "d.md" else []) for n, t, names in DOCS]
    with FakeOpenAI() as fake:
        client = LLMClient(fake.url, "fake", "vllm", max_retries=1, retry_base_seconds=0.001)
        judge = Judge(client)
        report = BatchReport()
        batch = build_batch(outcomes, "m", {}, report, people=people, judge=judge)
        sent = judged(fake)
        # asked again (a batch written again after a graph error): the same verdicts, no call
        build_batch(outcomes, "m", {}, BatchReport(), people=people, judge=judge)
        assert len(judged(fake)) == len(sent)

    # d.md once, e.md once, f.md twice (its first answer was unusable)
    assert [r["messages"][1]["content"].split("\n")[1] for r in sent] == [
        "Document: research/d.md", "Document: research/e.md", "Document: research/f.md",
        "Document: research/f.md"]
    assert sent[0]["messages"][1]["content"] == (
        "Name: John Smith\nDocument: research/d.md\n\nPassages:\n"
        "---\nJohn Smith met Ada Lovelace at the Contoso office.\n---\n\nCandidates:\n"
        "- Person:john smith: e-mail john.smith@contoso.com; works for contoso\n"
        "- Person:john smith <jsmith@northwind.example>: e-mail JSmith@northwind.example; "
        "works for northwind analytics")
    shape = sent[0]["response_format"]["json_schema"]["schema"]
    assert list(shape["properties"]) == ["reasons", "answer"]  # the reasons come first
    assert shape["properties"]["answer"]["enum"] == [JOHN, NORTH, "none"]

    reasons = "The passages mention contoso, which only Person:john smith is tied to."
    assert mentioned(batch, JOHN) == ["research/a.md", "research/d.md"]
    assert mentioned(batch, NORTH) == []
    assert sorted(batch.relationships) == [(JOHN, "RELATED_TO", "Person:ada lovelace")]
    assert batch.joins == {
        (JOHN, "research/a.md", "John Smith"): "employer Organization:contoso in the document",
        (JOHN, "research/d.md", "John Smith"): f"judge: {reasons}"}
    assert report.joins == {"employer": 1, "judge": 1}
    assert report.namesakes_linked == 2
    e, f = report.unlinked
    assert e == UnlinkedMention(
        document="research/e.md", name="John Smith", candidates=[JOHN, NORTH], relationships=0,
        judge="The passages name no employer or address that tells them apart.")
    assert (f.document, f.candidates) == ("research/f.md", [JOHN, NORTH])
    assert f.judge.startswith(
        "no verdict: gave up after 2 attempts: unusable output: answer: 'Person:somebody "
        "else' is neither a candidate nor none"), f.judge


def test_without_a_judge_nothing_is_sent_and_the_name_stays_unlinked() -> None:
    outcomes = [research(n, t, names) for n, t, names in DOCS[1:2]]
    report = BatchReport()
    build_batch(outcomes, "m", {}, report, people=people)
    assert report.unlinked == [UnlinkedMention(document="research/d.md", name="John Smith",
                                               candidates=[JOHN, NORTH], relationships=0)]


def test_an_unreachable_judge_is_no_verdict_and_the_batch_is_written() -> None:
    with FakeOpenAI() as fake:
        url = fake.url
    judge = Judge(LLMClient(url, "fake", "vllm", max_retries=0, timeout_seconds=2.0))
    verdict = judge(research("d.md", *DOCS[1][1:]).doc, "John Smith", GRAPH)
    assert verdict.key is None and verdict.reasons.startswith("no verdict: gave up after 1 "
                                                              "attempts: ConnectError"), verdict


def test_passages_are_windows_around_the_name_and_the_beginning_when_it_is_absent() -> None:
    text = "x" * 1000 + " John Smith spoke. " + "y" * 1000 + " JOHN SMITH again."
    got = passages(text, "John Smith")
    assert [len(p) for p in got] == [600, 317]
    assert got[0].startswith("x" * 299 + " John Smith") and got[1].endswith("JOHN SMITH again.")
    assert passages("Nobody here.", "John Smith") == ["Nobody here."]
