import asyncio
import time

import pytest

from tasks.extraction.calls import ExtractionConfig, extract_document
from tasks.extraction.documents import Document
from tasks.extraction.llm import LLMClient, response_format, strip_reasoning
from tasks.extraction.schema import json_schema
from tasks.shared.errors import ChunkTooLong, LLMError
from tests.fakes.openai_server import FakeOpenAI

SCHEMA = json_schema(12, 12)


def client(url: str, **kw: object) -> LLMClient:
    opts = {"max_concurrency": 4, "timeout_seconds": 1.0, "max_retries": 3,
            "retry_base_seconds": 0.01, **kw}
    return LLMClient(url, "fake", "vllm", **opts)  # type: ignore[arg-type]


def doc(text: str, name: str = "d.md") -> Document:
    return Document(f"transcripts/{name}", "transcripts", f"/x/{name}", "h", text, {"title": name})


def run(c: LLMClient, d: Document, chunk_tokens: int = 1000):
    async def go():
        async with c:
            return await extract_document(c, ExtractionConfig("fake", SCHEMA, chunk_tokens), d)
    return asyncio.run(go())


def test_dialects_shape_the_request() -> None:
    assert response_format("llama.cpp", {"type": "object"}) == \
        {"type": "json_object", "schema": {"type": "object"}}
    rf = response_format("vllm", {"type": "object"})
    assert rf["type"] == "json_schema" and rf["json_schema"]["schema"] == {"type": "object"}


def test_reasoning_is_stripped() -> None:
    assert strip_reasoning("<think>a {b}</think>\n{\"x\": 1}") == '{"x": 1}'
    assert strip_reasoning("partial reasoning</think>{}") == "{}"
    assert strip_reasoning("<think>{\"x\": 1}") == "{\"x\": 1}"  # the template opened it
    assert strip_reasoning("a <think> b") == "a <think> b"  # only a leading tag
    assert strip_reasoning("```json\n{}\n```") == "{}"


def test_schema_is_bounded() -> None:
    ents = SCHEMA["properties"]["entities"]
    assert ents["maxItems"] == 12
    assert ents["items"]["properties"]["name"]["maxLength"] == 80
    assert ents["items"]["additionalProperties"] is False


@pytest.mark.parametrize(("fault", "retries"), [("FAULT:500x2", 2), ("FAULT:429x3", 3),
                                               ("FAULT:503x1", 1), ("FAULT:slowx1", 1)])
def test_transient_errors_are_retried_and_recover(fake_llm: FakeOpenAI, fault: str,
                                                  retries: int) -> None:
    c = client(fake_llm.url)
    out = run(c, doc(f"Ann Lee met Bob Stone. {fault}"))
    assert out.error is None
    assert [e.name for e in out.extraction[0].entities] == ["Ann Lee", "Bob Stone"]
    assert (c.usage.retries, c.usage.calls) == (retries, retries + 1)


def test_gives_up_after_retries_with_the_reason(fake_llm: FakeOpenAI) -> None:
    c = client(fake_llm.url, max_retries=2)
    out = run(c, doc("Ann Lee. FAULT:500x10"))
    assert out.error_type == "LLMError" and "HTTP 500" in (out.error or "")
    assert out.attempts == 3 and fake_llm.calls == 3


def test_truncated_json_fails_after_retries(fake_llm: FakeOpenAI) -> None:
    out = run(client(fake_llm.url, max_retries=1), doc("Ann Lee met Bob Stone. FAULT:truncated"))
    assert out.error is not None and "malformed response" in out.error


def test_unknown_fields_are_dropped_and_counted_not_the_answer(fake_llm: FakeOpenAI) -> None:
    out = run(client(fake_llm.url, max_retries=0),
              doc("Ann Lee met Bob Stone and Cy Young. FAULT:extrafield"))
    assert out.error is None
    ex = out.extraction[0]
    assert [e.name for e in ex.entities] == ["Ann Lee", "Bob Stone", "Cy Young"]
    assert len(ex.relationships) == 2
    assert ex.repairs.dropped_fields == {"confidence": 1, "entities[].confidence": 3,
                                         "relationships[].evidence": 2}


def test_an_answer_over_the_schema_bounds_is_unusable_and_counted(fake_llm: FakeOpenAI) -> None:
    max_items = SCHEMA["properties"]["entities"]["maxItems"]
    c = client(fake_llm.url, max_retries=1)
    out = run(c, doc("Ann Lee met Bob Stone. FAULT:flood"))
    assert out.error_type == "LLMError" and out.attempts == 2
    assert f"entities: 3000 items > maxItems {max_items}" in (out.error or "")
    assert c.usage.unusable_answers == {"entities: maxItems": 2}


def test_an_overlong_name_is_unusable_output(fake_llm: FakeOpenAI) -> None:
    max_len = SCHEMA["properties"]["entities"]["items"]["properties"]["name"]["maxLength"]
    c = client(fake_llm.url, max_retries=0)
    out = run(c, doc("Ann Lee met Bob Stone. FAULT:longname"))
    assert f"entities[2].name: 300 characters > maxLength {max_len}" in (out.error or "")
    assert c.usage.unusable_answers == {"entities[].name: maxLength": 1}


def test_every_bound_of_the_sent_schema_is_enforced() -> None:
    from tasks.extraction.schema import SchemaViolation, parse_answer

    small = json_schema(2, 1, max_name=5, max_description=4)
    ent = {"name": "Ann", "type": "Person", "description": "d"}
    rel = {"source": "Ann", "target": "Bob", "type": "RELATED_TO", "description": ""}
    good = {"entities": [ent, {**ent, "name": "Bob"}], "relationships": [rel]}
    assert len(parse_answer(good, small).entities) == 2
    bad = [
        ({**good, "entities": [ent] * 3}, "entities: 3 items > maxItems 2"),
        ({**good, "relationships": [rel] * 2}, "relationships: 2 items > maxItems 1"),
        ({**good, "entities": [{**ent, "name": "Annabel"}]},
         "entities[0].name: 7 characters > maxLength 5"),
        ({**good, "entities": [{**ent, "description": "long"*2}]},
         "entities[0].description: 8 characters > maxLength 4"),
        ({"entities": [ent]}, "(answer): 'relationships' is required"),
        ({**good, "entities": [{"name": "Ann", "type": "Person"}]},
         "entities[0]: 'description' is required"),
        ({**good, "entities": [{**ent, "name": 5}]}, "entities[0].name: expected string, got integer"),
        ({**good, "entities": {"name": "Ann"}}, "entities: expected array, got object"),
        ([good], "(answer): expected object, got array"),
    ]
    for answer, reason in bad:
        with pytest.raises(SchemaViolation) as e:
            parse_answer(answer, small)
        assert reason in str(e.value), (reason, str(e.value))
    # enum: a label outside the whitelist maps onto it or the item is dropped, both counted;
    # nothing outside the sent enum comes through
    odd = {"entities": [{**ent, "type": "company"}, {**ent, "type": "Spaceship"}],
           "relationships": [{**rel, "type": "LOVES"}]}
    ex = parse_answer(odd, small)
    assert [e.type for e in ex.entities] == ["Organization"]
    assert [r.type for r in ex.relationships] == ["RELATED_TO"]
    assert ex.repairs.rejected_entity_types == {"Spaceship": 1}
    assert ex.repairs.remapped_relationship_types == {"LOVES": 1}


def test_a_retry_after_unusable_output_samples_differently(fake_llm: FakeOpenAI) -> None:
    """A greedy resend gets the same answer back: each retry after an unusable answer must
    change the sampling (temperature, seed), and the fake answers sampled requests well."""
    c = client(fake_llm.url, max_retries=3)
    out = run(c, doc("Ann Lee met Bob Stone. FAULT:greedyflood FAULT:500x1"))
    assert out.error is None and [e.name for e in out.extraction[0].entities] == \
        ["Ann Lee", "Bob Stone"]
    sampling = [(r["temperature"], r.get("seed")) for r in fake_llm.requests]
    # 500 (never answered: the same request again), then the greedy flood, then a sample
    assert sampling[0] == sampling[1] == (0.0, None)
    assert sampling[2][0] > 0 and sampling[2][1] is not None
    assert c.usage.unusable_answers == {"entities: maxItems": 1}


def test_every_retry_of_unusable_output_has_its_own_sampling(fake_llm: FakeOpenAI) -> None:
    out = run(client(fake_llm.url, max_retries=3), doc("Ann Lee. FAULT:flood"))
    assert out.error is not None
    sampling = [(r["temperature"], r.get("seed")) for r in fake_llm.requests]
    assert len(sampling) == 4 and len(set(sampling)) == 4
    assert all(t <= 1.0 for t, _ in sampling)


def test_a_timeout_names_the_url_and_the_limit(fake_llm: FakeOpenAI) -> None:
    out = run(client(fake_llm.url, max_retries=1), doc("Ann Lee. FAULT:slowx9"))
    assert out.error == (
        f"gave up after 2 attempts: ReadTimeout: no answer from {fake_llm.url}/v1/chat/"
        "completions within 1 s (request_timeout_seconds) — raise the inference block's "
        "request_timeout_seconds, or lower max_output_tokens")


def test_error_messages_are_never_empty(fake_llm: FakeOpenAI) -> None:
    from tasks.shared.processes import free_port

    down = run(client(f"http://127.0.0.1:{free_port()}", max_retries=0), doc("Ann Lee."))
    assert down.error and not down.error.rstrip().endswith(":")
    assert "ConnectError: could not connect to http://127.0.0.1:" in down.error


def test_think_blocks_do_not_reach_the_parser(fake_llm: FakeOpenAI) -> None:
    out = run(client(fake_llm.url), doc("Ann Lee met Bob Stone. FAULT:think"))
    assert out.error is None and len(out.extraction[0].entities) == 2


def test_length_finish_retries_on_smaller_chunks(fake_llm: FakeOpenAI) -> None:
    text = "\n".join(f"Line {i}: Ann Lee spoke to Person{i} Smith." for i in range(20))
    out = run(client(fake_llm.url), doc(text + "\nFAULT:length"))
    assert out.error is None
    # 832 characters: the whole chunk and the half with the marker (432) are over the fake's
    # 400, the other half (399) and the quarters are not: 5 calls, answered in 3 pieces
    assert len(out.extraction) == 3
    assert fake_llm.calls == 5


def test_length_finish_on_a_small_chunk_fails() -> None:
    with FakeOpenAI() as f:
        out = run(client(f.url), doc("FAULT:length" + "x" * 5000), chunk_tokens=4000)
    assert out.error_type == "ChunkTooLong"
    assert issubclass(ChunkTooLong, LLMError)


def test_concurrency_is_bounded_by_the_endpoint_limit() -> None:
    with FakeOpenAI(latency=0.2) as f:
        c = client(f.url, max_concurrency=3)
        docs = [doc(f"Ann Lee {i}", f"d{i}.md") for i in range(9)]

        async def go():
            async with c:
                return await asyncio.gather(*(extract_document(c, ExtractionConfig("fake", SCHEMA, 1000), d)
                                              for d in docs))
        t = time.monotonic()
        asyncio.run(go())
        elapsed = time.monotonic() - t
    assert f.max_in_flight == 3
    assert elapsed > 0.55  # 9 requests, 3 at a time, 0.2 s each (no upper bound: shared CPUs)


def test_http_400_that_is_not_about_context_is_not_retried(fake_llm: FakeOpenAI) -> None:
    out = run(client(fake_llm.url), doc("Ann Lee FAULT:400x5"))
    assert out.error_type == "LLMError" and "HTTP 400" in (out.error or "")
    assert fake_llm.calls == 1


def test_api_key_never_shows_in_repr_or_errors(fake_llm: FakeOpenAI) -> None:
    c = client(fake_llm.url, api_key="sk-live-very-secret", max_retries=0)
    assert "sk-live-very-secret" not in repr(c)
    out = run(c, doc("Ann Lee FAULT:500x5"))
    assert out.error and "sk-live-very-secret" not in out.error
    assert fake_llm.requests  # the key went where it belongs: the Authorization header
