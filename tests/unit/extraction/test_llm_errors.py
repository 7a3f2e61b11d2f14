"""HTTP errors of the inference endpoint, against a scripted stdlib server on loopback and the
real client (httpx): a context-length 400 splits the chunk, other 400s fail at once, 429/503
wait what Retry-After says (capped), then give up with the reason."""

from __future__ import annotations

import asyncio
import json
import time
from email.utils import formatdate
from typing import Any

import pytest

from tasks.extraction.calls import ExtractionConfig, extract_document
from tasks.extraction.documents import Document
from tasks.extraction.llm import LLMClient
from tasks.extraction.schema import Extraction, json_schema
from tasks.shared.errors import ChunkTooLong, LLMError, ServerDied
from tests.fakes.loopback import JsonHandler, LoopbackServer, Served

SCHEMA = json_schema(4, 4)
# What the servers really answer when a prompt does not fit (vLLM, llama.cpp, llama-cpp-python)
VLLM_CONTEXT = ('{"object":"error","message":"This model\'s maximum context length is 2048 '
                'tokens. However, you requested 3000 tokens.","type":"BadRequestError"}')
LLAMA_CPP_CONTEXT = ('{"error":{"code":400,"message":"the request exceeds the available '
                     'context size","type":"exceed_context_size_error"}}')


def answer(*names: str) -> tuple[int, dict[str, str], str]:
    content = json.dumps({"entities": [{"name": n, "type": "Person", "description": ""}
                                       for n in names], "relationships": []})
    return 200, {}, json.dumps({"choices": [{"message": {"content": content},
                                             "finish_reason": "stop"}],
                                "usage": {"prompt_tokens": 10, "completion_tokens": 5}})


class Scripted(Served):
    """Answers POSTs from a script of (status, headers, body), the last one repeating, or from
    `route(user_prompt)` when given; records each request's user prompt and arrival time."""

    def __init__(self, script: list[tuple[int, dict[str, str], str]] | None = None,
                 route: Any = None) -> None:
        self.script, self.route = list(script or []), route
        self.requests: list[tuple[float, str]] = []
        outer = self

        class Handler(JsonHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                user = self.read_json()["messages"][1]["content"]
                outer.requests.append((time.monotonic(), user))
                if outer.route:
                    status, headers, text = outer.route(user)
                else:
                    status, headers, text = (outer.script.pop(0) if len(outer.script) > 1
                                             else outer.script[0])
                rest = {k: v for k, v in headers.items() if k != "Content-Type"}
                self.send_body(status, text.encode(),
                               headers.get("Content-Type", "application/json"), rest)

        self.http = LoopbackServer(Handler)

    def gaps(self) -> list[float]:
        times = [t for t, _ in self.requests]
        return [b - a for a, b in zip(times, times[1:], strict=False)]


def client(url: str, **kw: Any) -> LLMClient:
    opts = {"max_retries": 2, "retry_base_seconds": 0.001, "retry_max_seconds": 5.0,
            "timeout_seconds": 10.0, **kw}
    return LLMClient(url, "m", "vllm", **opts)


def call(c: LLMClient, user: str = "text") -> Extraction:
    async def go() -> Extraction:
        async with c:
            return await c.extract("system", user, SCHEMA)
    return asyncio.run(go())


@pytest.mark.parametrize("body", [VLLM_CONTEXT, LLAMA_CPP_CONTEXT,
                                  '{"error": "Requested tokens (5000) exceed context window '
                                  'of 4096"}'])
def test_a_context_length_400_is_chunk_too_long_at_once(body: str) -> None:
    with Scripted([(400, {}, body)]) as srv:
        c = client(srv.url)
        with pytest.raises(ChunkTooLong, match="endpoint rejected the prompt as too long") as e:
            call(c)
    assert len(srv.requests) == 1 and e.value.attempts == 1
    assert (c.usage.calls, c.usage.retries) == (1, 0)


def test_another_400_fails_at_once_with_the_body_and_the_fix() -> None:
    with Scripted([(400, {}, '{"error": "unknown model m"}')]) as srv:
        with pytest.raises(LLMError) as e:
            call(client(srv.url))
    assert not isinstance(e.value, ChunkTooLong) and len(srv.requests) == 1
    assert str(e.value) == (f'HTTP 400 from {srv.url}: {{"error": "unknown model m"}} — check '
                            "the inference block's model and dialect")


def test_a_context_400_splits_the_chunk_and_keeps_both_halves() -> None:
    text = "\n".join(f"Line {i} says something" for i in range(8))

    def route(user: str) -> tuple[int, dict[str, str], str]:
        if "Line 0" in user and "Line 7" in user:
            return 400, {}, VLLM_CONTEXT
        return answer("First Half" if "Line 0" in user else "Second Half")

    doc = Document("transcripts/t.md", "transcripts", "/t.md", "h", text, {"title": "T"})
    with Scripted(route=route) as srv:
        async def go() -> Any:
            c = client(srv.url)
            async with c:
                return await extract_document(c, ExtractionConfig("fake", SCHEMA, 1000), doc)
        outcome = asyncio.run(go())
    assert outcome.error is None
    assert sorted(e.name for x in outcome.extraction for e in x.entities) == [
        "First Half", "Second Half"]
    halves = sorted(u.split("---\n", 1)[1] for _, u in srv.requests[1:])
    assert len(srv.requests) == 3
    # 8 lines of 21 characters: the last line break before the middle (character 87) ends line 2
    assert halves == ["\n".join(f"Line {i} says something" for i in range(3)),
                      "\n".join(f"Line {i} says something" for i in range(3, 8))]


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_seconds_is_waited_before_the_next_attempt(status: int) -> None:
    with Scripted([(status, {"Retry-After": "1"}, "busy"), answer("Ada Lovelace")]) as srv:
        c = client(srv.url)
        got = call(c)
    assert [e.name for e in got.entities] == ["Ada Lovelace"]
    assert len(srv.requests) == 2 and srv.gaps()[0] >= 1.0  # not the 0.001 s backoff
    assert (c.usage.calls, c.usage.retries) == (2, 1)


@pytest.mark.timeout(60)
def test_retry_after_is_capped_by_retry_max_seconds() -> None:
    with Scripted([(429, {"Retry-After": "3600"}, ""), answer("Ada Lovelace")]) as srv:
        call(client(srv.url, retry_max_seconds=0.5))
    assert 0.5 <= srv.gaps()[0] < 30


def test_retry_after_as_an_http_date_is_waited_too() -> None:
    when = formatdate(time.time() + 3, usegmt=True)  # whole seconds: waits 2 to 3 s
    with Scripted([(503, {"Retry-After": when}, ""), answer("Ada Lovelace")]) as srv:
        call(client(srv.url))
    assert srv.gaps()[0] >= 1.5


def test_an_unreadable_retry_after_falls_back_to_the_backoff() -> None:
    with Scripted([(503, {"Retry-After": "soon"}, ""), answer("Ada Lovelace")]) as srv:
        call(client(srv.url))
    assert len(srv.requests) == 2


def test_busy_to_the_end_gives_up_with_the_last_status_and_body() -> None:
    with Scripted([(429, {"Retry-After": "0"}, "slow down")]) as srv:
        c = client(srv.url, max_retries=3)
        with pytest.raises(LLMError) as e:
            call(c)
    assert len(srv.requests) == 4 and e.value.attempts == 4 and not e.value.endpoint_down
    assert e.value.unanswered  # the model never saw it: retried next run, not held
    assert str(e.value) == "gave up after 4 attempts: HTTP 429: slow down"
    assert (c.usage.calls, c.usage.retries) == (4, 3)


def test_backoff_values() -> None:
    c = LLMClient("http://x", "m", retry_base_seconds=1.0, retry_max_seconds=30.0)
    assert c._backoff(0, "7") == 7.0
    assert c._backoff(0, "2.5") == 2.5
    assert c._backoff(0, "0") == 0.0
    assert c._backoff(0, "100") == 30.0
    assert c._backoff(0, "-3") == 0.0
    # full jitter (tasks/shared/waiting.py): uniform in [0, min(retry_max, base * 2**attempt)], so
    # never above retry_max_seconds — attempt 9's 512 s is capped at 30
    for attempt, ceiling in [(0, 1.0), (1, 2.0), (3, 8.0), (9, 30.0)]:
        waits = [c._backoff(attempt, None) for _ in range(200)]
        assert all(0.0 <= w <= ceiling for w in waits)
        assert max(waits) - min(waits) > 0.2 * ceiling  # jittered, not constant
    assert 0.0 <= c._backoff(0, "") <= 1.0 and 0.0 <= c._backoff(0, "soon") <= 1.0


def _closed_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once it is closed


def test_a_dead_server_of_ours_ends_the_work_at_the_first_refusal() -> None:
    """The server this run started is gone: one refused request, no retries, and the reason
    (how it exited, its log) instead of 'could not connect' per document."""
    url = _closed_port()
    asked: list[int] = []

    def gone() -> str:
        asked.append(1)
        return "the inference server exited with signal 4 (SIGILL), see its log /s/inference.log"

    c = client(url, max_retries=3, server_exit=gone)

    async def run() -> None:
        async with c:
            await c.extract("sys", "Ada Lovelace", SCHEMA)

    with pytest.raises(ServerDied, match=r"exited with signal 4 \(SIGILL\), see its log "
                                         r"/s/inference\.log\n\(the request to .* failed: "
                                         r"ConnectError: could not connect"):
        asyncio.run(run())
    assert c.usage.calls == 1 and c.usage.retries == 0 and asked == [1]


def test_a_refusal_while_our_server_lives_is_retried_as_before() -> None:
    url = _closed_port()
    c = client(url, max_retries=2, server_exit=lambda: None)

    async def run() -> None:
        async with c:
            await c.extract("sys", "Ada Lovelace", SCHEMA)

    with pytest.raises(LLMError, match="gave up after 3 attempts: ConnectError") as e:
        asyncio.run(run())
    assert e.value.endpoint_down and c.usage.calls == 3


def test_a_document_the_model_answered_is_not_unanswered() -> None:
    """Off-schema JSON, then a gateway timeout: the model did answer once, so the failure
    is the document's (held), unlike one that only ever met 502/504s."""
    bad = (200, {}, json.dumps({"choices": [{"message": {"content": '{"entities": 3}'},
                                             "finish_reason": "stop"}]}))
    with Scripted([bad, (504, {}, "gateway timeout")]) as srv:
        with pytest.raises(LLMError) as e:
            call(client(srv.url, max_retries=1))
    assert not e.value.unanswered and not e.value.endpoint_down
    with Scripted([(502, {}, "bad gateway"), (504, {}, "gateway timeout")]) as srv:
        with pytest.raises(LLMError) as e:
            call(client(srv.url, max_retries=1))
    assert e.value.unanswered and not e.value.endpoint_down
    with Scripted([(500, {}, "grammar failed")]) as srv:  # a 500 may be the document's doing
        with pytest.raises(LLMError) as e:
            call(client(srv.url, max_retries=1))
    assert not e.value.unanswered


def test_a_document_that_only_timed_out_is_failed_but_not_held() -> None:
    """Every attempt times out: the document fails tonight and the next run retries it (a slow
    server is not the document's fault); only answers the model cannot produce hold one."""
    from tasks.extraction.batch import process_batch

    def slow(user: str) -> tuple[int, dict[str, str], str]:
        time.sleep(1.0)
        return answer("Ada Lovelace")

    class Store:
        failed: list[dict[str, Any]] = []
        extracted: list[Any] = []

        def keys_by_email(self, emails: Any, keys: Any = ()) -> dict[str, str]:
            return {}

        def splits(self) -> dict[str, set[str]]:
            return {}

        def retract(self, ids: Any) -> None: ...

        def upsert(self, batch: Any) -> None: ...

        def mark_extracted(self, docs: Any) -> None:
            self.extracted.extend(docs)

        def mark_failed(self, records: list[Any]) -> None:
            self.failed.extend(records)

    doc = Document("transcripts/a.md", "transcripts", "/x/a.md", "h1", "Ada met Charles.", {})
    store = Store()
    with Scripted(route=slow) as srv:
        report = process_batch([doc], store, client(srv.url, max_retries=1, timeout_seconds=0.2),  # type: ignore[arg-type]
                               ExtractionConfig("m", SCHEMA, 1000), set())
    assert [f.id for f in report.failed] == ["transcripts/a.md"]
    assert report.failed[0].held is False and store.failed == []
    assert report.failed[0].message.endswith(
        "— the server never answered (timeouts): retried on the next run")
