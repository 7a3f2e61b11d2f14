"""The llama.cpp path for real: llama-server serves SmolLM2-135M and a promoted GGUF LoRA adapter
under the bucket's name (one more alias), every request names its `lora` list, and asking by
the name answers with the adapter applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from blocks.serving import ServingEndpoint
from tasks.compute.inference_server import Served, start_llama_server, stop_llama_server
from tasks.records import AdapterManifest, BaseRef
from tasks.training.base_model import gguf_digest
from tasks.training.registry import ArtifactStore
from tasks.training.serving import local_serving, publish
from tests.support.random_lora import random_lora

BUCKET = "engineering-pointsav"
ALIAS = "SmolLM2-135M-Instruct"  # what phase 1 asks for
PROMPT = [{"role": "user", "content": "Write a haiku about the sea."}]
# Greedy and nothing else, the same on the server and in-process (their defaults differ).
GREEDY = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0,
          "max_tokens": 8}
THREADS = 1  # the 2 cores are shared


@pytest.fixture(scope="module")
def promoted(base_cache: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
             ) -> ArtifactStore:
    """A real GGUF LoRA for SmolLM2 (random lora_B, so it visibly changes greedy output),
    exported by llama.cpp's converter, registered and promoted as training would."""
    store = ArtifactStore(tmp_path_factory.mktemp("serving") / "artifacts")
    name = f"{BUCKET}-20261130T000000-abcd1234"
    out = store.adapter_dir(name)
    random_lora(base_cache["hf"], out, seed=1)
    gguf = base_cache["gguf"]
    store.write_manifest(AdapterManifest(
        name=name, bucket=BUCKET, method="sft",
        base=BaseRef(spec=str(gguf), hf_dir=str(base_cache["hf"]), gguf=str(gguf),
                     gguf_digest=gguf_digest(gguf)),
        data_digest="d", run_digest="abcd1234", dataset="x.parquet", params={}, state="done",
        verified=True, created="2026-11-30T00:00:00+00:00", created_by="test",
        files={"gguf": "adapter.gguf", "peft": "peft"}))
    store.promote(name, "test")
    return store


def _ask(url: str, model: str, scale: float | None = 1.0) -> str:
    lora = {} if scale is None else {"lora": [{"id": 0, "scale": scale}]}
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": model, "messages": PROMPT,
                                                       **GREEDY, **lora}, timeout=120)
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"])


def _in_process(gguf: Path, lora: Path | None) -> str:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(gguf), lora_path=str(lora) if lora else None, n_ctx=512,
                          # both at the server's settings: one thread for the prompt too, no
                          # flash attention (LOCAL_EXTRA) — greedy output differs otherwise
                          n_threads=THREADS, n_threads_batch=THREADS, flash_attn=False,
                          verbose=False)
    try:
        out: Any = llm.create_chat_completion(messages=PROMPT, **GREEDY)  # type: ignore[arg-type]
        return str(out["choices"][0]["message"]["content"])
    finally:
        llm.close()


def test_the_promoted_adapter_answers_by_the_bucket_name(promoted: ArtifactStore,
                                                         base_cache: dict[str, Any],
                                                         tmp_path: Path) -> None:
    gguf = base_cache["gguf"]
    serving = local_serving(promoted, BUCKET, gguf)
    assert serving.note is None and serving.names == (BUCKET,)
    assert serving.adapter == promoted.serving(BUCKET)
    state = tmp_path / "state"
    url = start_llama_server(state, Served(gguf, ALIAS, serving.adapter, serving.names), 512,
                             THREADS, 60)
    try:
        cards = httpx.get(f"{url}/v1/models").json()["data"]
        assert len(cards) == 1 and set(cards[0]["aliases"]) == {ALIAS, BUCKET}
        adapters = httpx.get(f"{url}/lora-adapters").json()
        assert [(a["id"], a["path"], a["scale"]) for a in adapters] == \
            [(0, str(serving.adapter), 1.0)]
        argv = (state / "inference.log").read_text().splitlines()[0]
        assert f" -a {ALIAS},{BUCKET} " in argv and f" --lora {serving.adapter} " in argv + " "

        as_before = _ask(url, ALIAS)  # phase 1's name serves the adapter, as before
        by_name = _ask(url, BUCKET)
        with_adapter = _in_process(gguf, serving.adapter)
        base = _in_process(gguf, None)
        assert by_name == as_before == with_adapter  # applied exactly
        assert by_name != base  # and not the base model's answer
        # The lora list decides per request, whatever the previous request cached: scale 0
        # is the base model, and naming scale 1 again gives the adapter's answer back exactly.
        assert _ask(url, BUCKET, scale=0.0) == base
        assert _ask(url, BUCKET) == with_adapter

        # The nightly's check, on this server as a configured llama.cpp endpoint.
        endpoint = ServingEndpoint(kind="llama.cpp", base_url=url, base_model=str(gguf),
                                   buckets=[BUCKET], check_prompt="Hi")
        res = publish(endpoint, promoted, BUCKET)
        assert res.state == "served" and res.answered and not res.loaded, res.message
        assert res.lora_path == str(serving.adapter)

        # llama-server answers a name it does not serve with its model (HTTP 200) — so the
        # check asks only for a name the server lists.
        assert _ask(url, "apprenticeship-pointsav") == by_name
        other = ServingEndpoint(kind="llama.cpp", base_url=url, base_model=str(gguf),
                                buckets=["apprenticeship-pointsav"])
        promoted.write_manifest(promoted.promoted(BUCKET).model_copy(  # type: ignore[union-attr]
            update={"bucket": "apprenticeship-pointsav", "name": "app-1"}))
        (promoted.adapter_dir("app-1") / "adapter.gguf").write_bytes(b"")
        promoted.promote("app-1", "test")
        res = publish(other, promoted, "apprenticeship-pointsav")
        assert res.state == "failed" and not res.answered
        assert "does not list 'apprenticeship-pointsav'" in res.message
        assert "llama.cpp loads adapters when it starts — restart llama-server" in res.message
    finally:
        stop_llama_server(state)


def test_an_adapter_trained_on_another_base_is_not_served(promoted: ArtifactStore,
                                                          base_cache: dict[str, Any]) -> None:
    """The F32 copy is another file (another digest): the server serves the base, and says why."""
    f32 = base_cache["f32"]
    serving = local_serving(promoted, BUCKET, f32)
    assert serving.adapter is None and serving.names == ()
    assert serving.note is not None
    assert f"but the server serves {f32} (digest {gguf_digest(f32)})" in serving.note
    assert serving.note.endswith("— serving the base model instead (retrain the bucket on this "
                                 f"base, or roll back: slm-nightly adapters rollback {BUCKET})")
