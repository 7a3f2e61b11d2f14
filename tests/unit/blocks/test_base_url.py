"""An inference base_url written the OpenAI SDK's way (`http://host:9080/v1`) works like the
plain one: the block keeps the server's root, and every place that joins `/v1/...` or
`/health` onto a URL it is handed takes the root first. Against a stdlib server on loopback
that answers only the real paths (/health, /v1/models, /v1/chat/completions)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from blocks.inference import InferenceEndpoint, server_root
from tasks.compute.inference_server import models_ready, probe, wait_ready
from tasks.extraction.llm import LLMClient
from tasks.extraction.schema import json_schema
from tests.fakes.loopback import JsonHandler, LoopbackServer

ANSWER = json.dumps({"choices": [{"message": {"content": json.dumps(
    {"entities": [{"name": "Ada", "type": "Person", "description": ""}], "relationships": []})},
    "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})


@pytest.mark.parametrize(("given", "root"), [
    ("http://10.0.0.5:9080", "http://10.0.0.5:9080"),
    ("http://10.0.0.5:9080/", "http://10.0.0.5:9080"),
    ("http://10.0.0.5:9080/v1", "http://10.0.0.5:9080"),
    ("http://10.0.0.5:9080/v1/", "http://10.0.0.5:9080"),
    ("https://llm.example.com/proxy/v1", "https://llm.example.com/proxy"),
    ("https://llm.example.com/v10", "https://llm.example.com/v10"),  # not the /v1 suffix
])
def test_the_block_keeps_the_servers_root(given: str, root: str) -> None:
    assert server_root(given) == root
    assert InferenceEndpoint(base_url=given).base_url == root


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    paths: list[str] = []

    class Handler(JsonHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            paths.append(self.path)
            if self.path == "/v1/models":
                self.send_json(200, '{"data": [{"id": "m"}]}')
            elif self.path == "/health":
                self.send_json(200, "{}")
            else:
                self.send_json(404, '{"error": "not found"}')

        def do_POST(self) -> None:  # noqa: N802
            self.read_body()
            paths.append(self.path)
            if self.path == "/v1/chat/completions":
                self.send_json(200, ANSWER)
            else:
                self.send_json(404, '{"error": "not found"}')

    with LoopbackServer(Handler) as srv:
        yield srv.url, paths


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_readiness_and_requests_work_with_either_form(server: tuple[str, list[str]],
                                                      suffix: str) -> None:
    root, paths = server
    url = root + suffix
    assert models_ready(url)
    assert probe(url) == ("ready", ["m"])
    assert wait_ready(url, timeout=2.0) >= 0.0

    async def ask() -> Any:
        async with LLMClient(url, "m", "vllm", max_retries=0, timeout_seconds=5.0) as c:
            return await c.extract("system", "text", json_schema(4, 4))

    got = asyncio.run(ask())
    assert [e.name for e in got.entities] == ["Ada"]
    assert set(paths) == {"/v1/models", "/health", "/v1/chat/completions"}


@pytest.mark.parametrize(("health", "stage"), [
    # llama-server while it loads: 503 {"error": {"message": "Loading model", ...}}
    (503, "loading the model (GET /health: HTTP 503)"),
    (500, "unhealthy (GET /health: HTTP 500)"),
])
def test_a_loading_server_is_not_called_unhealthy(health: int, stage: str) -> None:
    class Handler(JsonHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_json(health, '{"error": {"message": "Loading model", "code": 503}}')

    with LoopbackServer(Handler) as srv:
        assert probe(srv.url) == (stage, [])
