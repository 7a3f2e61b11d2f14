"""A Think model that may think, on the real llama-server: the tiny random OLMo 3
(tests/support/olmo3_tiny.py) served with a chat template that marks reasoning (the assistant turn
opens `<think>`, and `reasoning_content` renders between `<think>` and `</think>`:
tests/fixtures/think-template.jinja). With a reasoning budget the model thinks up to N tokens
into `reasoning_content`, then answers in `content` under the schema; off, the grammar holds
from the first token. The reasoning text never reaches the extraction (nor the graph).

What only the node's real GGUF can confirm: whether OLMo 3 Think's own template marks
reasoning the way this one does (`GET /props` → the template, and llama-server's parser
choice in its log) — bench/gpu_node_check.py prints it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tasks.compute.inference_server import Served, ServerSettings, llama_server_args, server_ready
from tasks.engine.llama_cpp import require_server
from tasks.extraction.llm import LLMClient, strip_reasoning, structured_output
from tasks.extraction.prompt import system_prompt
from tasks.extraction.schema import json_schema
from tasks.graph.ontology import default_schema
from tasks.shared.processes import ManagedServer, free_port
from tests.support.paths import ROOT

TEMPLATE = ROOT / "tests" / "fixtures" / "think-template.jinja"
SCHEMA = json_schema(2, 1, max_name=16, max_description=16)
TEXT = "Ada Lovelace worked with Charles Babbage in London."


@pytest.fixture
def think_server(olmo3_tiny: dict[str, Any], tmp_path: Path) -> Any:
    port = free_port()
    argv = llama_server_args(require_server(), Served(olmo3_tiny["gguf"], "olmo3-tiny"),
                             ServerSettings(slots=1, context_tokens=2048, threads=1,
                                            extra=["--chat-template-file", str(TEMPLATE)]),
                             host="127.0.0.1", port=port)
    url = f"http://127.0.0.1:{port}"
    server = ManagedServer("think", tmp_path)
    server.start(argv, port, marker=f"--port {port}", ready=lambda: server_ready(url),
                 timeout=60)
    yield url, tmp_path / "think.log"
    server.stop()


def _raw(url: str, budget: int | None) -> dict[str, Any]:
    """One request as the client sends it, answered in full (to see reasoning_content)."""
    body = {"model": "olmo3-tiny", "max_tokens": 320, "temperature": 0.0,
            "messages": [{"role": "system", "content": system_prompt(default_schema())},
                         {"role": "user", "content": TEXT}],
            **structured_output("llama.cpp", SCHEMA, budget is not None),
            **({"reasoning_budget_tokens": budget} if budget is not None else {})}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _extract(url: str, budget: int | None) -> Any:
    async def go() -> Any:
        async with LLMClient(url, "olmo3-tiny", "llama.cpp", max_output_tokens=320,
                             reasoning_budget=budget, max_retries=0,
                             timeout_seconds=300) as c:
            return await c.extract(system_prompt(default_schema()), TEXT, SCHEMA), c.usage
    return asyncio.run(go())


def test_the_template_marks_reasoning(think_server: tuple[str, Path]) -> None:
    url, _ = think_server
    props = httpx.get(f"{url}/props").json()
    assert "<think>" in props["chat_template"]


def test_with_a_budget_the_model_thinks_then_answers_under_the_schema(
        think_server: tuple[str, Path]) -> None:
    url, _ = think_server
    raw = _raw(url, 24)
    msg = raw["choices"][0]["message"]
    reasoning = msg.get("reasoning_content") or ""
    assert reasoning.strip(), msg  # it thought …
    # … at most the budget (tokens; the forced end tag comes after it)
    assert raw["usage"]["completion_tokens"] > 24
    assert msg["content"].lstrip().startswith("{"), msg  # and answered JSON in content
    answer, usage = _extract(url, 24)
    fields = [f for e in answer.entities for f in (e.name, e.description)] + \
        [f for r in answer.relationships for f in (r.source, r.target, r.description)]
    # the reasoning text never reaches the extraction
    assert all(reasoning.strip()[:12] not in f for f in fields if f)
    assert usage.unusable_answers == {}


def test_off_the_grammar_holds_from_the_first_token(think_server: tuple[str, Path]) -> None:
    url, _ = think_server
    raw = _raw(url, None)
    msg = raw["choices"][0]["message"]
    # reasoning_format none: the answer stays in content, after the <think> the template
    # opened (without it the server's parser took the whole JSON for thinking: content "")
    assert not (msg.get("reasoning_content") or "").strip(), msg
    assert msg["content"].startswith("<think>{"), msg
    assert strip_reasoning(msg["content"]).startswith("{")
    answer, usage = _extract(url, None)
    assert len(answer.entities) <= 2 and usage.unusable_answers == {}
