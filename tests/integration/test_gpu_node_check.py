"""bench/gpu_node_check.py's request path for real, on the CPU: phase 1's own client sends the
night's requests (distinct example-document chunks, the system prompt, the schema's GBNF
grammar, the server's lora list) to llama-server serving SmolLM2-135M, at 1 and then 2
concurrent, and the report's numbers agree with each other and with the server's /metrics."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from blocks.inference import InferenceEndpoint
from tasks.compute.inference_server import (
    SERVER_NAME,
    Served,
    start_llama_server,
    stop_llama_server,
)
from tasks.engine.llama_cpp import default_model_path
from tasks.graph.ontology import default_schema
from tasks.shared.processes import ManagedServer

ROOT = Path(__file__).resolve().parents[2]
ALIAS = "SmolLM2-135M-Instruct"
# A small context and small bounds, so that every answer fits max_tokens under the grammar:
# at most one entity (a name of 80 characters, a description of 16) and no relationship.
ENDPOINT = InferenceEndpoint(model=ALIAS, dialect="llama.cpp", context_tokens=1536,
                             max_output_tokens=160, max_concurrent_requests=2, max_entities=1,
                             max_relationships=0, max_description_chars=16, repeat_penalty=1.1)


def _check() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("gpu_node_check",
                                                  ROOT / "bench" / "gpu_node_check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    state = tmp_path_factory.mktemp("gpu-check")
    url = start_llama_server(state, Served(default_model_path(), ALIAS),
                             n_ctx=ENDPOINT.context_tokens, n_threads=1, readiness_timeout=120,
                             slots=2)
    record = ManagedServer(SERVER_NAME, state).record()
    assert record is not None
    try:
        yield url, record.pid
    finally:
        stop_llama_server(state)


def test_the_night_requests_at_1_and_2_concurrent(server: tuple[str, int]) -> None:
    check = _check()
    url, pid = server
    ontology = default_schema()
    prompts = check.night_prompts(ENDPOINT, ontology, 3)
    assert len({u for _, u in prompts}) == 3  # distinct chunks of the example documents
    assert all(u.startswith("Document: ") and "\n---\n" in u for _, u in prompts)
    rows = [check.night_level(url, ENDPOINT, ontology, prompts[:1], 1),
            check.night_level(url, ENDPOINT, ontology, prompts[1:], 2)]
    for row, n in zip(rows, (1, 2), strict=True):
        assert (row["concurrency"], row["requests"], row["calls"]) == (n, n, n)
        assert row["parsed"] == n and row["errors"] == {} and row["unusable"] == {}
        assert row["lora"] == []  # the server loads no adapter: the client sends none
        m = row["metrics"]
        assert set(m) == {"prompt_tokens_total", "prompt_tokens_cached_total",
                          "prompt_seconds_total", "tokens_predicted_total",
                          "tokens_predicted_seconds_total"}
        # the server decoded what the client was told it did, and processed (or reused from
        # its cache) every prompt token the client was told of
        assert m["tokens_predicted_total"] == row["completion_tokens"] > 0
        assert m["prompt_tokens_total"] + m["prompt_tokens_cached_total"] \
            == row["prompt_tokens"] > 0
        # the client's rate: its completion tokens over the level's wall time (both rounded)
        assert abs(row["client_tok_per_s"] * row["wall_s"] - row["completion_tokens"]) < 1
        assert row["server_decode_tok_per_s_per_stream"] > 0
        assert row["server_prompt_tok_per_s"] > 0
    memory = check.server_memory(pid)
    assert set(memory) == {"vmrss_mib", "vmhwm_mib"}
    assert 0 < memory["vmrss_mib"] <= memory["vmhwm_mib"]
    assert "unreadable" in check.server_memory(None)
