"""The served chat template and a reasoning budget: the node's chat_template_file (default: the
shipped OLMo 3 Think template, tasks/compute/templates/), its place in llama-server's command
line, and the refusals of the preflight (tasks/preflight/node.py) and the node smoke
(flows/smoke.py) when the template cannot honour the budget. On the real llama-server:
tests/integration/test_olmo3_template.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from blocks.inference import InferenceEndpoint
from blocks.node_serve import SHIPPED_TEMPLATE, NodeServeSettings
from flows.smoke import served_template_thinks, template_verdict
from tasks.compute.engines import chat_template_on_node
from tasks.compute.gce.startup import llama_cpp_launch_args, render_startup_script
from tasks.preflight.node import reasoning_template_check, template_thinks
from tasks.shared.errors import ConfigError
from tests.support.paths import ROOT

TEMPLATES = ROOT / "tasks" / "compute" / "templates"
UPSTREAM = "tasks/compute/templates/olmo3-think.upstream.jinja"
FIX = ("set [compute.node] chat_template_file = \"tasks/compute/templates/olmo3-think.jinja\" "
       "(OLMo 3 Think's template with reasoning_content between <think> and </think>), or "
       "unset [inference] reasoning_budget_tokens")


def test_template_thinks_as_llama_server_detects_it() -> None:
    assert template_thinks((TEMPLATES / "olmo3-think.jinja").read_text()) is True
    assert template_thinks((TEMPLATES / "olmo3-think.upstream.jinja").read_text()) is False
    assert template_thinks((ROOT / "tests/fixtures/think-template.jinja").read_text()) is True
    # reasoning rendered without an end tag after it, or not rendered, or a broken template
    assert template_thinks("{% for m in messages %}<think>{{ m.reasoning_content }}"
                           "{{ m.content }}{% endfor %}") is False
    assert template_thinks("{% for m in messages %}{{ m.content }}</think>{% endfor %}") is False
    assert template_thinks("{% for m in messages %}{{ raise_exception('no') }}{% endfor %}") \
        is False
    assert template_thinks("{% if %}") is False


def test_the_node_serves_the_shipped_template_from_its_checkout() -> None:
    s = NodeServeSettings()
    assert s.chat_template_file == SHIPPED_TEMPLATE == "tasks/compute/templates/olmo3-think.jinja"
    assert chat_template_on_node(s) == "/opt/slm-nightly/tasks/compute/templates/olmo3-think.jinja"
    assert chat_template_on_node(NodeServeSettings(chat_template_file="/opt/t.jinja")) \
        == "/opt/t.jinja"
    assert NodeServeSettings(chat_template_file="").chat_template_file is None
    assert chat_template_on_node(NodeServeSettings(chat_template_file=None)) is None
    for bad in ("../t.jinja", " t.jinja", "/opt/../t.jinja"):
        with pytest.raises(ValidationError, match="a path without surrounding blanks or `..`"):
            NodeServeSettings(chat_template_file=bad)
    ep = InferenceEndpoint(dialect="llama.cpp")
    argv = llama_cpp_launch_args(ep, settings=s)
    at = argv.index("--chat-template-file")
    assert argv[at + 1] == "/opt/slm-nightly/tasks/compute/templates/olmo3-think.jinja"
    assert "--chat-template-file" not in llama_cpp_launch_args(
        ep, settings=NodeServeSettings(chat_template_file=None))
    script = render_startup_script(ep, settings=s)
    assert ("[ -f /opt/slm-nightly/tasks/compute/templates/olmo3-think.jinja ] || fail 'chat "
            "template /opt/slm-nightly/tasks/compute/templates/olmo3-think.jinja is missing — "
            "update the checkout on the node, or fix [compute.node] chat_template_file'") in script


def test_the_preflight_refuses_a_budget_the_served_template_cannot_honour(tmp_path: Path) -> None:
    ok = reasoning_template_check(NodeServeSettings(), 256)
    assert (ok.ok, ok.skipped) == (True, False)
    assert ok.detail == ("tasks/compute/templates/olmo3-think.jinja renders reasoning_content "
                         "between thinking tags: the budget of 256 tokens is honoured")
    off = reasoning_template_check(NodeServeSettings(chat_template_file=None), None)
    assert off.skipped and off.detail == "[inference] reasoning_budget_tokens is not set"

    own = reasoning_template_check(NodeServeSettings(chat_template_file=None), 256)
    assert not own.ok and own.fix == FIX
    assert own.detail == (
        "[inference] reasoning_budget_tokens = 256, but [compute.node] chat_template_file is "
        "empty: llama-server serves the GGUF's own chat template, which cannot be checked here "
        "(OLMo 3 Think's has no </think>), and drops the budget unless the template has a "
        "thinking end tag")
    up = reasoning_template_check(NodeServeSettings(chat_template_file=UPSTREAM), 256)
    assert not up.ok and up.fix == FIX
    assert up.detail == (
        "[inference] reasoning_budget_tokens = 256, but [compute.node] chat_template_file "
        f"{UPSTREAM} renders no thinking end tag after an assistant turn's reasoning_content: "
        "llama-server would drop the budget")
    gone = str(tmp_path / "none.jinja")
    missing = reasoning_template_check(NodeServeSettings(chat_template_file=gone), 256)
    assert not missing.ok and missing.fix == FIX
    assert missing.detail == (
        f"[inference] reasoning_budget_tokens = 256, but [compute.node] chat_template_file "
        f"{gone} cannot be read here ({gone}: FileNotFoundError) to check that it marks "
        "reasoning")
    mine = tmp_path / "mine.jinja"
    mine.write_text((ROOT / "tests/fixtures/think-template.jinja").read_text())
    assert reasoning_template_check(NodeServeSettings(chat_template_file=str(mine)), 8).ok


def _props(template: str, preserve: bool) -> dict[str, Any]:
    return {"chat_template": (TEMPLATES / template).read_text(),
            "chat_template_caps": {"supports_preserve_reasoning": preserve,
                                   "supports_reasoning_effort": False}}


def test_the_smoke_refuses_a_budget_the_engine_s_template_cannot_honour(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert template_verdict(_props("olmo3-think.jinja", True), 256) == (
        "its chat template marks reasoning: the budget of 256 tokens is honoured")
    refused = (
        "[inference] reasoning_budget_tokens = 256, but the engine's chat template marks no "
        "reasoning (GET /props: chat_template_caps.supports_preserve_reasoning = false, no "
        "thinking end tag after reasoning_content): llama-server drops the budget — set "
        "[compute.node] chat_template_file = \"tasks/compute/templates/olmo3-think.jinja\", or "
        "unset [inference] reasoning_budget_tokens")
    with pytest.raises(ConfigError) as e:
        template_verdict(_props("olmo3-think.upstream.jinja", False), 256)
    assert str(e.value) == refused
    with pytest.raises(ConfigError):  # caps and text must agree
        template_verdict(_props("olmo3-think.upstream.jinja", True), 256)

    asked: list[tuple[str, dict[str, str]]] = []

    def get(url: str, headers: dict[str, str], timeout: float) -> httpx.Response:
        asked.append((url, headers))
        return httpx.Response(200, json=_props("olmo3-think.upstream.jinja", False),
                              request=httpx.Request("GET", url))

    monkeypatch.setattr(httpx, "get", get)

    class Cfg:
        inference = InferenceEndpoint(dialect="llama.cpp", api_key="k",
                                      reasoning_budget_tokens=256)

    with pytest.raises(ConfigError) as e:
        served_template_thinks(Cfg(), "http://10.0.0.2:9080/v1")  # type: ignore[arg-type]
    assert str(e.value) == refused
    assert asked == [("http://10.0.0.2:9080/props", {"Authorization": "Bearer k"})]
