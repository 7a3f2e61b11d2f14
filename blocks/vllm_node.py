"""How the GPU node runs vLLM (the `[compute.vllm]` table of a GCE profile): configuration
only. The `vllm serve` command line and the startup script built from it are
tasks/compute/startup_script.py."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class VllmServeSettings(BaseModel):
    """How vLLM is launched on the node (one L4, 24 GB)."""

    model_config = ConfigDict(extra="forbid")
    vllm_bin: str = Field(default="/opt/vllm/bin/vllm", description="vllm executable on the node image.")
    model_path: str = Field(
        default="/opt/models/Olmo-3-32B-Think-Q3_K_M.gguf",
        description="GGUF weights on the node's disk (32B Think, Q3_K_M: ~16 GB, fits an L4).")
    tokenizer: str = Field(
        default="allenai/Olmo-3-32B-Think",
        description="HF tokenizer for the GGUF (vLLM's GGUF tokenizer conversion is slow and lossy); "
                    "a local folder on the node image avoids a download at boot.")
    gpu_memory_utilization: float = Field(default=0.92, gt=0.1, le=0.98)
    structured_outputs_backend: str = Field(default="xgrammar")
    reasoning_parser: str | None = Field(default="olmo3", description="Empty for non-reasoning models.")
    max_lora_rank: int = Field(default=64, ge=1, le=512)
    max_num_seqs: int | None = Field(default=None, ge=1, description="Empty = vLLM's default.")
    extra_args: list[str] = Field(default_factory=list, description="Appended as they are.")
    prefect_bin: str = Field(default="/opt/prefect/bin/prefect", description="prefect on the node.")
    work_pool: str = Field(default="slm-node", description="Pool the node's Prefect worker serves.")
    prefect_api_url: str | None = Field(default=None, description="PREFECT_API_URL for the worker.")
    prefect_api_key_secret: str | None = Field(
        default=None,
        description="Secret Manager secret holding PREFECT_API_KEY (read on the node with the "
                    "node's service account — never put the key itself in instance metadata, "
                    "which anyone with compute.instances.get can read).")

    @field_validator("model_path", "vllm_bin", "prefect_bin")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"must be an absolute path on the node (got {v!r})")
        return v
