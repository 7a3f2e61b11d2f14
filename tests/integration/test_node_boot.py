"""The node's boot as the rendered startup script runs it (tests/fakes/node_runtime.py executes the
script with bash on the fake Compute Engine, paths mapped): llama.cpp's server started by the
rendered command serves a structured request; a startup failure ends readiness at once with
its cause; the engine and the worker run offline, as the service user, from the one .venv —
for real where the test runs as root: the runtime applies useradd, chown and User=, so a
folder the script leaves to root refuses the unit that must write there."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from blocks.inference import InferenceEndpoint
from tasks.compute.gce.lifecycle import GceNode
from tasks.compute.gce.startup import ENGINE_ERROR_ATTRIBUTE, ENGINE_UNIT, WORKER_UNIT
from tasks.shared.errors import ServerError
from tasks.shared.processes import free_port
from tests.fakes.compute_engine import FakeComputeEngine
from tests.fakes.node_runtime import FakeNode
from tests.support.checkout import orchestrator_checkout
from tests.support.gce import PROJECT, gce
from tests.support.paths import ROOT

NODE_MODEL = "/opt/models/smollm2.gguf"
# engine_threads 1: the test workers share the cores, and llama.cpp's 2 threads spun against
# each other (81 s of CPU for one 200-token answer under `make test`, 7 s on an idle machine)
NODE_SETTINGS = {"project_dir": "/opt/slm-nightly", "model_path": NODE_MODEL,
                 "model_architecture": "llama", "hf_home": "/opt/slm-hf",
                 "tokenizer": "/opt/models/smollm2-tokenizer", "engine_threads": 1}


def node_paths(tmp: Path, model: Path, checkout: Path = ROOT) -> dict[str, str]:
    """The node's paths as this test maps them: the checkout is this repository (or a copy)."""
    return {"/opt/slm-nightly": str(checkout), NODE_MODEL: str(model),
            "/opt/slm-hf": str(tmp / "hf")}


@pytest.fixture
def booted(tmp_path: Path) -> Iterator[dict[str, Any]]:
    from tasks.engine.llama_cpp import default_model_path

    # the image's checkout, left to root as a root-run build leaves it: the script must hand
    # it to the service user (ownership is applied: the runtime may chown only in tmp_path)
    checkout = orchestrator_checkout(tmp_path / "checkout")
    (checkout / ".venv").symlink_to(ROOT / ".venv")
    runtime = FakeNode(tmp_path, paths=node_paths(tmp_path, default_model_path(), checkout),
                       secrets={"prefect-key": "pnu_fake_key_1234",
                                "slm-prefect-auth": "slm:auth-5678",
                                "engine-key": ENGINE_KEY}, project=PROJECT,
                       ownership=True)
    with FakeComputeEngine(PROJECT) as fake:
        runtime.attach(fake)
        fake.add_instance("zone-a", "node", boot_seconds=0.2)
        yield {"fake": fake, "runtime": runtime}
    runtime.close()


ENGINE_KEY = "sk-engine-4242"


def _install(fake: FakeComputeEngine, tmp: Path, port: int, api_key: str | None = None,
             **node: Any) -> tuple[GceNode, InferenceEndpoint]:
    compute = gce(fake, tmp, inference_port=port, poll_seconds=0.2,
                  node={**NODE_SETTINGS, **node})
    endpoint = InferenceEndpoint(model="smol", dialect="llama.cpp", context_tokens=2048,
                                 max_output_tokens=256, readiness_timeout_seconds=120,
                                 api_key=api_key)
    compute.install_startup_script(endpoint)
    return compute, endpoint


def test_the_rendered_llama_cpp_engine_serves_a_structured_request_offline(
        booted: dict[str, Any], tmp_path: Path) -> None:
    import asyncio

    from tasks.extraction.llm import LLMClient
    from tasks.extraction.prompt import system_prompt
    from tasks.extraction.schema import json_schema
    from tasks.graph.ontology import default_schema

    fake, runtime = booted["fake"], booted["runtime"]
    port = free_port()
    worker_api = "http://127.0.0.1:9/api"  # the worker only has to start: its env is checked
    compute, endpoint = _install(fake, tmp_path, port, api_key=ENGINE_KEY,
                                 prefect_api_url=worker_api,
                                 prefect_api_key_secret="prefect-key",
                                 prefect_auth_string_secret="slm-prefect-auth",
                                 engine_api_key_secret="engine-key")
    compute.start()
    url = compute.start_inference(endpoint)
    assert url == f"http://127.0.0.1:{port}"

    async def one() -> Any:  # the extraction client, in the dialect the engine check demands
        async with LLMClient(url, "smol", "llama.cpp", max_output_tokens=200, max_retries=2,
                             timeout_seconds=120, api_key=ENGINE_KEY) as client:
            return await client.extract(system_prompt(default_schema()), "Ada Lovelace worked with Charles "
                                        "Babbage in London.", json_schema(2, 1, 40, 40))

    answer = asyncio.run(one())
    assert len(answer.entities) <= 2 and len(answer.relationships) <= 1
    # both units run as the service user, offline, with the fixed HF_HOME
    hf = str(tmp_path / "hf")
    for unit in (ENGINE_UNIT, WORKER_UNIT):
        env = runtime.unit_environ("zone-a", "node", unit)
        assert (env["HF_HUB_OFFLINE"], env["TRANSFORMERS_OFFLINE"], env["HF_HOME"]) == \
            ("1", "1", hf), unit
        assert runtime.unit_user("zone-a", "node", unit) == "slm"
    if runtime.ownership:  # root here: the units really run as slm, in what slm owns
        uid = runtime.uid("zone-a", "node", "slm")
        assert uid is not None
        for unit in (ENGINE_UNIT, WORKER_UNIT):
            assert runtime.unit_uid("zone-a", "node", unit) == uid, unit
            env = runtime.unit_environ("zone-a", "node", unit)
            assert (env["USER"], Path(env["HOME"]).stat().st_uid) == ("slm", uid), unit
        for path in (tmp_path / "checkout", tmp_path / "checkout" / "flows" / "nightly.py",
                     tmp_path / "hf"):
            assert path.stat().st_uid == uid, path
    worker_env = runtime.unit_environ("zone-a", "node", WORKER_UNIT)
    assert worker_env["PREFECT_API_URL"] == worker_api
    assert worker_env["PREFECT_API_KEY"] == "pnu_fake_key_1234"
    # a self-hosted server's auth string (gcp setup's slm-prefect-auth), read like the key
    assert worker_env["PREFECT_API_AUTH_STRING"] == "slm:auth-5678"
    script = fake.instance("zone-a", "node").metadata["startup-script"]
    assert "pnu_fake_key_1234" not in script and "auth-5678" not in script
    # the engine wants its key (from Secret Manager, never the script): a probe without it is
    # refused, and the stop still sees the engine was up
    assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 401
    assert ENGINE_KEY not in script
    # the watcher's stop is a stop, not a failure: the unit's ExecStopPost writes nothing
    assert compute.stop_inference()
    time.sleep(1.5)
    assert ENGINE_ERROR_ATTRIBUTE not in fake.instance("zone-a", "node").guest_attributes
    compute.stop()
    assert not runtime.unit_running("zone-a", "node", ENGINE_UNIT)
    assert not runtime.unit_running("zone-a", "node", WORKER_UNIT)


def test_a_missing_secret_fails_readiness_at_once_naming_it(
        booted: dict[str, Any], tmp_path: Path) -> None:
    fake, runtime = booted["fake"], booted["runtime"]
    compute, endpoint = _install(fake, tmp_path, free_port(),
                                 prefect_api_url="http://127.0.0.1:9/api",
                                 prefect_api_key_secret="no-such-secret")
    compute.start()
    t = time.monotonic()
    with pytest.raises(ServerError, match=r"startup script of .*zones/zone-a/instances/node "
                       r"failed: reading Secret Manager secret no-such-secret failed: ERROR: "
                       r"\(gcloud.secrets.versions.access\) NOT_FOUND.*journalctl -u "
                       r"google-startup-scripts"):
        compute.start_inference(endpoint)
    assert time.monotonic() - t < 15  # not readiness_timeout_seconds (120)
    assert runtime.script_exit("zone-a", "node") == 1
    assert not runtime.unit_running("zone-a", "node", ENGINE_UNIT)
    compute.stop()


# llama-server's last words when the L4 cannot hold the weights (ggml-cuda.cu's CUDA_CHECK)
DIES_AT_LOAD = ("import sys; print('load_tensors: offloading 64 repeating layers to GPU'); "
                "print('CUDA error: out of memory'); print('  current device: 0'); sys.exit(1)")


def test_an_engine_that_dies_at_load_ends_the_wait_in_seconds_naming_the_cause(
        booted: dict[str, Any], tmp_path: Path) -> None:
    """Issue 39: the engine's unit fails after the script succeeded; its ExecStopPost (run as
    systemd runs it, SERVICE_RESULT=exit-code, EXIT_STATUS=1) writes slm/engine-error, and the
    readiness wait stops at once instead of waiting out readiness_timeout_seconds (120 here,
    1,800 in production) while the watcher restarts it."""
    fake, runtime = booted["fake"], booted["runtime"]
    runtime.overrides[ENGINE_UNIT] = [sys.executable, "-c", DIES_AT_LOAD]
    compute, endpoint = _install(fake, tmp_path, free_port(),
                                 prefect_api_url="http://127.0.0.1:9/api")
    compute.start()
    t = time.monotonic()
    with pytest.raises(ServerError) as failed:
        compute.start_inference(endpoint)
    took = time.monotonic() - t
    message = str(failed.value)
    assert took < 30, took
    assert "the engine (slm-engine) of " in message and "failed: exit-code (exited 1)" in message
    assert "CUDA error: out of memory" in message and "journalctl -u slm-engine" in message
    assert runtime.script_exit("zone-a", "node") == 0  # the script itself succeeded
    compute.stop()
