"""The fake Compute Engine's project and the orchestrator's service account, and the GCE node
and profile the GCE tests build on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect_gcp import GcpCredentials

from blocks.gce import GceCompute
from tasks.compute.gce.lifecycle import GceNode
from tests.fakes.compute_engine import FakeComputeEngine
from tests.fakes.gcs import service_account
from tests.support.profiles import toml_profile

PROJECT = "test-project"
SA = service_account("http://127.0.0.1:1/token")  # one RSA key for the module (keygen is slow)


def creds(fake: FakeComputeEngine) -> GcpCredentials:
    return GcpCredentials(service_account_info={**SA, "token_uri": fake.token_uri},
                          project=PROJECT)


def gce(fake: FakeComputeEngine, tmp: Path, **kw: Any) -> GceNode:
    fields: dict[str, Any] = dict(project=PROJECT, zone="zone-a", instance="node",
                                  api_endpoint=fake.url, gcp_credentials=creds(fake),
                                  state_dir=str(tmp / "state"), poll_seconds=0.1,
                                  boot_timeout_seconds=10, stop_timeout_seconds=10,
                                  retry_base_seconds=0.01, retry_max_seconds=0.05)
    fields.update(kw)
    return GceNode(GceCompute(**fields))


# The node's engine as the preflight checks it (tasks/compute/engines.py): the fake engine
# (tests/fakes/openai_server.py) speaks vLLM's dialect, and `llama` is an architecture in vLLM's GGUF
# list, so the nightly's preflight passes on it.
VLLM_NODE = {"engine": "vllm", "model_architecture": "llama"}


def gce_profile(tmp: Path, block: str, falkordb: int, graph: str,
                inference: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
                top: dict[str, Any] | None = None, readiness_seconds: int = 30) -> Path:
    """A profile on a saved GceCompute block; documents under tmp/docs (the three streams).
    `top`: top-level keys; `inference`: more [inference] keys; `extra`: more sections."""
    src = tmp / "docs"
    for stream in ("transcripts", "research", "contacts"):
        (src / stream).mkdir(parents=True, exist_ok=True)
    return toml_profile(
        tmp / "gce.toml", state_dir=tmp / "state", **(top or {}),
        compute={"type": "gce", "block": block},
        inference={"dialect": "vllm", "model": "fake", "readiness_timeout_seconds": readiness_seconds,
                   "context_tokens": 2048, "max_output_tokens": 256, **(inference or {})},
        graph={"type": "falkordb", "host": "127.0.0.1", "port": falkordb, "graph_name": graph},
        sources={s: src / s for s in ("transcripts", "research", "contacts")}, **(extra or {}))
