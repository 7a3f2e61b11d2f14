import asyncio
import time

import pytest

from tasks.documents import Document
from tasks.errors import ChunkTooLong, LLMError
from tasks.extract import extract_document
from tasks.llm import LLMClient, response_format, strip_reasoning
from tasks.schema import json_schema
from tests.fake_openai import FakeOpenAI

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
            return await extract_document(c, d, chunk_tokens, 0, SCHEMA)
    return asyncio.run(go())


def test_dialects_shape_the_request() -> None:
    assert response_format("llama.cpp", {"type": "object"}) == \
        {"type": "json_object", "schema": {"type": "object"}}
    rf = response_format("vllm", {"type": "object"})
    assert rf["type"] == "json_schema" and rf["json_schema"]["schema"] == {"type": "object"}


def test_reasoning_is_stripped() -> None:
    assert strip_reasoning("<think>a {b}</think>\n{\"x\": 1}") == '{"x": 1}'
    assert strip_reasoning("partial reasoning</think>{}") == "{}"
    assert strip_reasoning("```json\n{}\n```") == "{}"


def test_schema_is_bounded() -> None:
    ents = SCHEMA["properties"]["entities"]
    assert ents["maxItems"] == 12
    assert ents["items"]["properties"]["name"]["maxLength"] == 80
    assert ents["items"]["additionalProperties"] is False


@pytest.mark.parametrize("fault", ["FAULT:500x2", "FAULT:429x3", "FAULT:503x1", "FAULT:slowx1"])
def test_transient_errors_are_retried_and_recover(fake_llm: FakeOpenAI, fault: str) -> None:
    c = client(fake_llm.url)
    out = run(c, doc(f"Ann Lee met Bob Stone. {fault}"))
    assert out.error is None
    assert [e.name for e in out.extraction[0].entities] == ["Ann Lee", "Bob Stone"]
    assert c.usage.retries >= 1 and c.usage.calls == c.usage.retries + 1


def test_gives_up_after_retries_with_the_reason(fake_llm: FakeOpenAI) -> None:
    c = client(fake_llm.url, max_retries=2)
    out = run(c, doc("Ann Lee. FAULT:500x10"))
    assert out.error_type == "LLMError" and "HTTP 500" in (out.error or "")
    assert out.attempts == 3 and fake_llm.calls == 3


def test_truncated_json_fails_after_retries(fake_llm: FakeOpenAI) -> None:
    out = run(client(fake_llm.url, max_retries=1), doc("Ann Lee met Bob Stone. FAULT:truncated"))
    assert out.error is not None and "malformed response" in out.error


def test_extra_fields_are_forbidden(fake_llm: FakeOpenAI) -> None:
    out = run(client(fake_llm.url, max_retries=0), doc("Ann Lee. FAULT:extra"))
    assert out.error is not None and "confidence" in out.error


def test_think_blocks_do_not_reach_the_parser(fake_llm: FakeOpenAI) -> None:
    out = run(client(fake_llm.url), doc("Ann Lee met Bob Stone. FAULT:think"))
    assert out.error is None and len(out.extraction[0].entities) == 2


def test_length_finish_retries_on_smaller_chunks(fake_llm: FakeOpenAI) -> None:
    text = "\n".join(f"Line {i}: Ann Lee spoke to Person{i} Smith." for i in range(20))
    out = run(client(fake_llm.url), doc(text + "\nFAULT:length"))
    assert out.error is None
    assert len(out.extraction) >= 2  # answered in pieces
    assert fake_llm.calls >= 3


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
                return await asyncio.gather(*(extract_document(c, d, 1000, 0, SCHEMA)
                                              for d in docs))
        t = time.monotonic()
        asyncio.run(go())
        elapsed = time.monotonic() - t
    assert f.max_in_flight == 3
    assert 0.55 < elapsed < 1.5  # 9 requests, 3 at a time, 0.2 s each


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
