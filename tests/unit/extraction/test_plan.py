"""The extraction plan: which documents are skipped, held, extracted, or retracted.

A document's state in the graph records the hash, model and prompt version it was extracted
with (or failed with); the plan compares all three."""

from typing import Any

from tasks.extraction.calls import ExtractionConfig
from tasks.extraction.documents import Document, LoadFailure
from tasks.extraction.plan import Reextract, plan
from tasks.extraction.prompt import extraction_version
from tasks.graph.ontology import default_schema

# what a document with text is marked with under the shipped schema and prompt
PROMPT_VERSION = extraction_version(default_schema())

MODEL = "olmo-3"
STREAMS = ("transcripts", "research", "contacts")


def doc(name: str, digest: str = "h1", stream: str = "transcripts") -> Document:
    return Document(f"{stream}/{name}", stream, f"/src/{name}", digest, "text")


def done(digest: str = "h1", model: str = MODEL, prompt: str = PROMPT_VERSION,
         stream: str = "transcripts") -> dict[str, Any]:
    return {"hash": digest, "model": model, "prompt_version": prompt, "stream": stream}


def failed(digest: str = "h1", model: str = MODEL, prompt: str = PROMPT_VERSION,
           reason: str = "LLMError: gave up", stream: str = "transcripts") -> dict[str, Any]:
    return {"failed_hash": digest, "failed_model": model, "failed_prompt_version": prompt,
            "failed_reason": reason, "stream": stream}


def ask(model: str) -> ExtractionConfig:
    """What phase 1 asks with the shipped schema and no gleaning (the schema sent is not read
    by the plan)."""
    return ExtractionConfig(model, {}, 1000)


def ids(docs: list[Document]) -> list[str]:
    return [d.id for d in docs]


def test_a_new_document_is_extracted_and_not_counted_as_changed() -> None:
    p = plan([doc("a.md")], [], {}, ask(MODEL), STREAMS)
    assert (ids(p.extract), p.skipped, p.changed, p.deleted, p.held) == (
        ["transcripts/a.md"], [], [], [], [])


def test_an_unchanged_document_is_skipped() -> None:
    p = plan([doc("a.md")], [], {"transcripts/a.md": done()}, ask(MODEL), STREAMS)
    assert (p.extract, ids(p.skipped), p.changed, p.deleted) == ([], ["transcripts/a.md"], [], [])


def test_changed_content_model_or_prompt_each_cause_reextraction() -> None:
    states = {"transcripts/hash.md": done(digest="old"),
              "transcripts/model.md": done(model="other-model"),
              "transcripts/prompt.md": done(prompt=PROMPT_VERSION + "-old"),
              "transcripts/same.md": done()}
    docs = [doc("hash.md"), doc("model.md"), doc("prompt.md"), doc("same.md")]
    p = plan(docs, [], states, ask(MODEL), STREAMS)
    changed = ["transcripts/hash.md", "transcripts/model.md", "transcripts/prompt.md"]
    assert ids(p.extract) == changed and p.changed == changed
    assert ids(p.skipped) == ["transcripts/same.md"]
    assert p.reasons == {"content": 1, "model": 1, "extraction version": 1}


def test_the_model_argument_is_what_is_compared() -> None:
    states = {"transcripts/a.md": done(model="m1")}
    assert ids(plan([doc("a.md")], [], states, ask("m1"), STREAMS).skipped) == ["transcripts/a.md"]
    assert ids(plan([doc("a.md")], [], states, ask("m2"), STREAMS).extract) == ["transcripts/a.md"]


def test_full_reextracts_everything_unchanged_too() -> None:
    states = {"transcripts/a.md": done(), "transcripts/b.md": failed()}
    p = plan([doc("a.md"), doc("b.md")], [], states, ask(MODEL), STREAMS, Reextract(full=True))
    assert ids(p.extract) == ["transcripts/a.md", "transcripts/b.md"]
    assert p.changed == ["transcripts/a.md", "transcripts/b.md"]
    assert p.skipped == [] and p.held == []
    assert p.reasons == {"full": 2}  # one fresh, one failed: both again for --full


def test_a_document_that_failed_unchanged_is_held_with_its_reason() -> None:
    states = {"transcripts/a.md": failed(reason="LLMError: unusable output")}
    p = plan([doc("a.md")], [], states, ask(MODEL), STREAMS)
    assert [(d.id, why) for d, why in p.held] == [("transcripts/a.md", "LLMError: unusable output")]
    assert p.extract == [] and p.skipped == []


def test_a_failed_document_is_retried_when_its_content_model_or_prompt_changed() -> None:
    states = {"transcripts/hash.md": failed(digest="old"),
              "transcripts/model.md": failed(model="other"),
              "transcripts/prompt.md": failed(prompt="p0")}
    p = plan([doc("hash.md"), doc("model.md"), doc("prompt.md")], [], states, ask(MODEL), STREAMS)
    assert ids(p.extract) == ["transcripts/hash.md", "transcripts/model.md",
                              "transcripts/prompt.md"]
    assert p.held == []
    assert p.reasons == {"content": 1, "model": 1, "extraction version": 1}


def test_retry_failed_extracts_held_documents_but_still_skips_fresh_ones() -> None:
    states = {"transcripts/a.md": failed(), "transcripts/b.md": done()}
    p = plan([doc("a.md"), doc("b.md")], [], states, ask(MODEL), STREAMS, Reextract(retry_failed=True))
    assert ids(p.extract) == ["transcripts/a.md"] and p.changed == ["transcripts/a.md"]
    assert ids(p.skipped) == ["transcripts/b.md"] and p.held == []
    assert p.reasons == {"retry": 1}


def test_gleaning_passes_are_part_of_what_a_document_was_extracted_with() -> None:
    # done without gleaning; asked now with one pass: a new extraction version
    states = {"transcripts/a.md": done()}
    p = plan([doc("a.md")], [], states, ExtractionConfig(MODEL, {}, 1000, gleanings=1), STREAMS)
    assert ids(p.extract) == ["transcripts/a.md"] and p.reasons == {"extraction version": 1}
    assert ids(plan([doc("a.md")], [], states, ExtractionConfig(MODEL, {}, 1000, gleanings=0),
                    STREAMS).skipped) == ["transcripts/a.md"]


def test_a_fresh_extraction_wins_over_an_older_failure_record() -> None:
    # extracted fine at h1 after a failure at h1 was recorded: skip, do not hold
    states = {"transcripts/a.md": {**failed(), **done()}}
    p = plan([doc("a.md")], [], states, ask(MODEL), STREAMS)
    assert ids(p.skipped) == ["transcripts/a.md"] and p.held == []


def test_a_deleted_file_is_retracted_only_in_the_streams_scanned() -> None:
    states = {"transcripts/gone.md": done(), "research/gone.yaml": done(stream="research"),
              "contacts/gone.json": done(stream="contacts"), "transcripts/here.md": done()}
    p = plan([doc("here.md")], [], states, ask(MODEL), ["transcripts", "contacts"])
    assert p.deleted == ["contacts/gone.json", "transcripts/gone.md"]  # sorted; research kept


def test_a_file_that_fails_to_load_keeps_its_graph_contribution() -> None:
    states = {"transcripts/broken.md": done(), "transcripts/gone.md": done()}
    failure = LoadFailure("transcripts/broken.md", "transcripts", "/src/broken.md", "h2",
                          "not valid UTF-8")
    p = plan([], [failure], states, ask(MODEL), STREAMS)
    assert p.deleted == ["transcripts/gone.md"]
    assert (p.extract, p.skipped, p.changed, p.held) == ([], [], [], [])


def test_a_state_without_a_stream_is_never_retracted() -> None:
    p = plan([], [], {"transcripts/x.md": {"hash": "h1"}}, ask(MODEL), STREAMS)
    assert p.deleted == []


def test_streams_may_be_a_one_shot_iterator() -> None:
    states = {"transcripts/a.md": done(), "research/b.md": done(stream="research")}
    p = plan([], [], states, ask(MODEL), iter(["research"]))
    assert p.deleted == ["research/b.md"]


def test_a_retried_failure_is_counted_as_a_retry_though_an_older_success_differs() -> None:
    # extracted at h0, edited to h1, failed at h1: --retry-failed sends it again as a retry
    states = {"transcripts/a.md": {**done("h0"), **failed("h1")}}
    p = plan([doc("a.md", "h1")], [], states, ask(MODEL), STREAMS, Reextract(retry_failed=True))
    assert ids(p.extract) == ["transcripts/a.md"] and p.reasons == {"retry": 1}
