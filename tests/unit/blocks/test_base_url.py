"""An inference base_url written the OpenAI SDK's way (`http://host:9080/v1`) works like the
plain one: the block keeps the server's root, and every place that joins `/v1/...` or
`/health` onto a URL it is handed takes the root first. Against a stdlib server on loopback
that answers only the real paths (/health, /v1/models, /v1/chat/completions)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from blocks.inference import InferenceEndpoint, server_root
from tasks.compute.inference_server import models_ready, probe, wait_ready
from tasks.extraction.llm import LLMClient
from tasks.extraction.schema import json_schema

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

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            paths.append(self.path)
            if self.path == "/v1/models":
                self._send(200, '{"data": [{"id": "m"}]}')
            elif self.path == "/health":
                self._send(200, "{}")
            else:
                self._send(404, '{"error": "not found"}')

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            paths.append(self.path)
            if self.path == "/v1/chat/completions":
                self._send(200, ANSWER)
            else:
                self._send(404, '{"error": "not found"}')

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", paths
    finally:
        srv.shutdown()
        srv.server_close()


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
