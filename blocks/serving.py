"""The serving endpoint for the trained model, as configuration: a server (vLLM with runtime
LoRA updating, or llama.cpp's) that clients ask for each bucket's promoted adapter by the
bucket's name. What the nightly does with it (load the new adapter, check it answers) is
tasks/training/serving.py."""

from __future__ import annotations

from typing import Literal

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator

from blocks.inference import server_root


class ServingEndpoint(Block):
    """Where promoted adapters are served by name (the `[serving]` section of a profile)."""

    _block_type_name = "SLM Serving Endpoint"
    _description = "Serves each bucket's promoted LoRA adapter under the bucket's name."

    kind: Literal["vllm", "llama.cpp"] = Field(
        default="vllm",
        description="vllm: adapters are loaded at run time (POST /v1/load_lora_adapter; the "
        "server runs with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora). llama.cpp: "
        "adapters are loaded when the server starts (its config file); the nightly only checks.")
    base_url: str = Field(description="e.g. http://10.0.0.7:8000 (the /v1 form means the same).")
    api_key: SecretStr | None = Field(default=None, description="Bearer token, if the server "
                                      "wants one (vLLM --api-key).")
    base_model: str = Field(
        description="The base the server serves, as adapter manifests name it: the recipe's "
        "base_model (e.g. allenai/Olmo-3-7B-Think@main), or for llama.cpp the GGUF's path or "
        "digest. An adapter trained on another base is not loaded.")
    adapter_root: str | None = Field(
        default=None, description="The artifact store's adapters/ folder as the server sees it "
        "(a mount of the GCS bucket, a shared disk); the adapter loaded is "
        "<adapter_root>/<adapter>/peft (vllm) or …/adapter.gguf (llama.cpp). Empty: this "
        "machine's <artifact_store>/adapters (the server runs here).")
    buckets: list[str] = Field(
        default_factory=lambda: ["engineering-pointsav", "apprenticeship-pointsav"],
        description="Whose promoted adapters are served (each under its bucket's name).")
    check_prompt: str = Field(default="Reply with one word: ready?",
                              description="What the nightly asks each name to check it answers.")
    timeout_seconds: float = Field(default=120.0, gt=0, description="Per request (loading an "
                                   "adapter reads it from disk).")

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https:// (e.g. http://127.0.0.1:8000)")
        return server_root(v)

    def describe(self) -> str:
        return f"{self.kind} at {self.base_url} (base {self.base_model})"
