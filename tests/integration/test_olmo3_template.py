"""OLMo 3 Think's own chat template (tasks/compute/templates/, cited in its README) on the real
llama-server, with the tiny random OLMo 3 (tests/support/olmo3_tiny.py).

- The upstream copy never renders `reasoning_content` and has no `</think>`: llama-server's
  template analysis (vendored common/chat-diff-analyzer.cpp) finds no reasoning markers, so
  `GET /props` shows `supports_preserve_reasoning: false` and a `reasoning_budget_tokens` is
  not passed on (tools/server/server-common.cpp: only with a thinking end tag).
- The shipped copy (the upstream one plus the line that renders `reasoning_content` between
  `<think>` and `</think>`) shows it true, and a budgeted request thinks, then answers JSON
  under the schema — the node's default `chat_template_file`.
- tasks.preflight.node.template_thinks judges both files the way the server did."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from blocks.node_serve import SHIPPED_TEMPLATE, NodeServeSettings
from tasks.compute.inference_server import Served, ServerSettings, llama_server_args, server_ready
from tasks.engine.llama_cpp import require_server
from tasks.extraction.llm import strip_reasoning, structured_output
from tasks.extraction.prompt import system_prompt
from tasks.extraction.schema import json_schema, parse_answer
from tasks.graph.ontology import default_schema
from tasks.preflight.node import template_thinks
from tasks.shared.processes import ManagedServer, free_port
from tests.support.paths import ROOT

TEMPLATES = ROOT / "tasks" / "compute" / "templates"
UPSTREAM = TEMPLATES / "olmo3-think.upstream.jinja"
SHIPPED = TEMPLATES / "olmo3-think.jinja"
SCHEMA = json_schema(2, 1, max_name=16, max_description=16)
TEXT = "Ada Lovelace worked with Charles Babbage in London."
# tasks/compute/templates/README.md
UPSTREAM_SHA256 = "eba6e269f669706e5c788e370160dad953137f3fa7014fa69d03c7b3ad9f0e72"
SHIPPED_SHA256 = "1ade20769787775f065428f54ea9c21048f753f8715c1056f863e77217336315"


def _serve(gguf: Path, template: Path, tmp: Path, name: str) -> Iterator[str]:
    port = free_port()
    argv = llama_server_args(require_server(), Served(gguf, "olmo3-tiny"), ServerSettings(
        slots=1, context_tokens=2048, threads=1, extra=["--chat-template-file", str(template)]),
        host="127.0.0.1", port=port)
    url = f"http://127.0.0.1:{port}"
    server = ManagedServer(name, tmp)
    server.start(argv, port, marker=f"--port {port}", ready=lambda: server_ready(url),
                 timeout=60)
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def upstream(olmo3_tiny: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[str]:
    yield from _serve(olmo3_tiny["gguf"], UPSTREAM, tmp_path_factory.mktemp("up"), "upstream")


@pytest.fixture(scope="module")
def shipped(olmo3_tiny: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[str]:
    yield from _serve(olmo3_tiny["gguf"], SHIPPED, tmp_path_factory.mktemp("sh"), "shipped")


def test_the_files_are_the_cited_ones_and_the_node_default_is_the_shipped_one() -> None:
    assert hashlib.sha256(UPSTREAM.read_bytes()).hexdigest() == UPSTREAM_SHA256
    assert hashlib.sha256(SHIPPED.read_bytes()).hexdigest() == SHIPPED_SHA256
    assert (TEMPLATES / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert NodeServeSettings().chat_template_file == SHIPPED_TEMPLATE
    assert SHIPPED_TEMPLATE == "tasks/compute/templates/olmo3-think.jinja"
    # the shipped file is the upstream one plus one insertion (what renders the reasoning)
    up, ship = UPSTREAM.read_text(), SHIPPED.read_text()
    added = ("{% if message.get('reasoning_content', none) %}{{ '<think>' + "
             "message['reasoning_content'] + '</think>' }}{% endif %}")
    assert ship.replace(added, "", 1) == up and added not in up
    assert up.endswith("{{ '<|im_start|>assistant\n<think>' }}{% endif %}{% endfor %}")


def test_upstream_props_show_no_reasoning(upstream: str) -> None:
    props = httpx.get(f"{upstream}/props", timeout=30).json()
    assert props["chat_template"] == UPSTREAM.read_text()
    assert props["chat_template_caps"]["supports_preserve_reasoning"] is False
    assert props["chat_template_caps"]["supports_reasoning_effort"] is False
    assert "</think>" not in props["chat_template"]
    assert template_thinks(props["chat_template"]) is False


def test_upstream_drops_the_budget(upstream: str) -> None:
    """The budget is not passed on: nothing is split into reasoning_content, and the schema's
    grammar holds from the first token (the model never thinks)."""
    msg = _ask(upstream, 24)["choices"][0]["message"]
    assert not (msg.get("reasoning_content") or "").strip(), msg
    assert msg["content"].lstrip().startswith("{"), msg  # the grammar held from the first token


def test_shipped_props_show_reasoning(shipped: str) -> None:
    props = httpx.get(f"{shipped}/props", timeout=30).json()
    assert props["chat_template"] == SHIPPED.read_text()
    assert props["chat_template_caps"]["supports_preserve_reasoning"] is True
    assert template_thinks(props["chat_template"]) is True


def test_shipped_budgeted_request_thinks_then_answers_under_the_schema(shipped: str) -> None:
    raw = _ask(shipped, 24)
    msg = raw["choices"][0]["message"]
    assert (msg.get("reasoning_content") or "").strip(), msg  # it thought …
    assert raw["usage"]["completion_tokens"] > 24  # … the budget, then the forced end tag …
    assert msg["content"].lstrip().startswith("{"), msg  # … and answered JSON in content,
    answer = parse_answer(json.loads(strip_reasoning(msg["content"])), SCHEMA)  # under the schema
    assert len(answer.entities) <= 2


def _ask(url: str, budget: int) -> dict[str, Any]:
    """One budgeted request as tasks/extraction/llm.py sends it."""
    body = {"model": "olmo3-tiny", "max_tokens": 320, "temperature": 0.0,
            "messages": [{"role": "system", "content": system_prompt(default_schema())},
                         {"role": "user", "content": TEXT}],
            **structured_output("llama.cpp", SCHEMA, True),
            "reasoning_budget_tokens": budget}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return dict(r.json())
