"""The inference endpoint: an OpenAI-compatible server (vLLM on the GPU node, llama.cpp locally)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator, model_validator

from tasks.errors import ConfigError

if TYPE_CHECKING:
    from tasks.extraction.llm import LLMClient


class InferenceEndpoint(Block):
    """Where phase 1 sends `/v1/chat/completions`, and how hard it may push."""

    _block_type_name = "SLM Inference Endpoint"
    _description = "OpenAI-compatible chat endpoint used for structured extraction."

    base_url: str | None = Field(
        default=None,
        description="e.g. http://10.0.0.5:9080. Empty: the compute node starts a server and "
        "provides the URL.",
    )
    model: str = Field(default="SmolLM2-135M-Instruct", description="Model name the server serves.")
    api_key: SecretStr | None = Field(default=None, description="Bearer token, if the server wants one.")
    dialect: Literal["vllm", "llama.cpp", "openai"] = Field(
        default="vllm", description="Structured-output request shape the server understands."
    )
    max_concurrent_requests: int = Field(
        default=8, ge=1, le=1024, description="In-flight requests at once (vLLM batches them)."
    )
    request_timeout_seconds: float = Field(default=300.0, gt=0, description="Per request.")
    readiness_timeout_seconds: float = Field(
        default=5400.0, gt=0, description="How long to wait for /v1/models to answer."
    )
    context_tokens: int = Field(default=4096, ge=512, description="The server's context window.")
    max_output_tokens: int = Field(default=1024, ge=64, description="max_tokens per request.")
    chunk_overlap_tokens: int = Field(default=64, ge=0, description="Overlap between chunks.")
    max_entities: int = Field(default=24, ge=1, le=200, description="Schema bound per chunk.")
    max_relationships: int = Field(default=24, ge=0, le=200, description="Schema bound per chunk.")
    max_description_chars: int = Field(default=160, ge=16, le=2000, description="Schema bound.")
    max_retries: int = Field(default=4, ge=0, le=20, description="Retries on transient errors.")
    retry_base_seconds: float = Field(default=1.0, ge=0, description="First backoff delay.")

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v and not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https:// (e.g. http://127.0.0.1:9080)")
        return v.rstrip("/") if v else v

    @model_validator(mode="after")
    def _fits(self) -> InferenceEndpoint:
        if self.max_output_tokens >= self.context_tokens // 2:
            raise ValueError(
                f"max_output_tokens ({self.max_output_tokens}) must be under half of "
                f"context_tokens ({self.context_tokens}) to leave room for the document"
            )
        return self

    def chunk_tokens(self) -> int:
        """Document tokens per request: the context minus the answer and the prompt."""
        from tasks.extraction.extract import prompt_overhead_tokens

        return max(128, self.context_tokens - self.max_output_tokens - prompt_overhead_tokens())

    def response_schema(self) -> dict[str, Any]:
        """The bounded JSON schema every request asks for."""
        from tasks.extraction.schema import json_schema

        return json_schema(self.max_entities, self.max_relationships,
                           max_description=self.max_description_chars)

    def get_client(self, base_url: str | None = None) -> LLMClient:
        """A client for this endpoint (at `base_url` when the compute node provides it)."""
        from tasks.extraction.llm import LLMClient

        url = base_url or self.base_url
        if not url:
            raise ConfigError("inference: no endpoint — pass base_url, or set base_url in the "
                              "profile's [inference] (the nightly flow's node starts one)")
        return LLMClient(
            base_url=url, model=self.model, dialect=self.dialect,
            api_key=self.api_key.get_secret_value() if self.api_key else None,
            max_concurrency=self.max_concurrent_requests,
            timeout_seconds=self.request_timeout_seconds, max_retries=self.max_retries,
            retry_base_seconds=self.retry_base_seconds, max_output_tokens=self.max_output_tokens)
