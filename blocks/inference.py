"""The inference endpoint: an OpenAI-compatible server (vLLM on the GPU node, llama.cpp locally)."""

from __future__ import annotations

from typing import Literal

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator, model_validator


def server_root(url: str) -> str:
    """An OpenAI-compatible server's root URL, which the project joins `/v1/...` and `/health`
    onto: the OpenAI SDK's way of writing it (`http://host:9080/v1`, with or without a
    trailing slash) and the plain one (`http://host:9080`) give the same root."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


# Output tokens a reasoning budget must leave for the JSON answer after the thinking.
REASONING_ANSWER_ROOM = 256


class InferenceEndpoint(Block):
    """Where phase 1 sends `/v1/chat/completions`, and how hard it may push."""

    _block_type_name = "SLM Inference Endpoint"
    _description = "OpenAI-compatible chat endpoint used for structured extraction."

    base_url: str | None = Field(
        default=None,
        description="e.g. http://10.0.0.5:9080 (http://10.0.0.5:9080/v1, the OpenAI SDK's form, "
        "means the same). Empty: the compute node starts a server and provides the URL.",
    )
    model: str = Field(default="SmolLM2-135M-Instruct", description="Model name the server serves.")
    api_key: SecretStr | None = Field(default=None, description="Bearer token, if the server wants one.")
    dialect: Literal["vllm", "llama.cpp", "openai"] = Field(
        default="vllm", description="Structured-output request shape the server understands."
    )
    max_concurrent_requests: int = Field(
        default=8, ge=1, le=1024,
        description="Ceiling on in-flight requests per endpoint (node). The client finds the "
        "best number under it by measuring throughput and latency, and backs off on 429/503, "
        "timeouts and refused connections. A llama-server this project starts (locally, on "
        "the node) gets this many slots (-np), each of context_tokens.",
    )
    request_timeout_seconds: float = Field(
        default=300.0, gt=0,
        description="Per request until answers are measured; then 3 x max_output_tokens / the "
        "measured per-request decode rate, at least 30 s (or this value, if lower).",
    )
    readiness_timeout_seconds: float = Field(
        default=5400.0, gt=0, description="How long to wait for /v1/models to answer."
    )
    context_tokens: int = Field(default=4096, ge=512, description="The context window of one "
                                "request (one llama-server slot).")
    max_output_tokens: int = Field(default=1024, ge=64, description="max_tokens per request.")
    chunk_overlap_tokens: int = Field(default=64, ge=0, description="Overlap between chunks.")
    max_entities: int = Field(default=24, ge=1, le=200, description="Schema bound per chunk.")
    max_relationships: int = Field(default=24, ge=0, le=200, description="Schema bound per chunk.")
    max_description_chars: int = Field(default=160, ge=16, le=2000, description="Schema bound.")
    reasoning_budget_tokens: int | None = Field(
        default=None, ge=0,
        description="Reasoning mode for a Think model on llama-server. Empty: off — the JSON "
        "grammar holds from the first token (the model cannot think). N: the model thinks up to "
        "N tokens into reasoning_content (never read, never in the graph), then answers under "
        "the schema; max_output_tokens must leave room for the answer after them. Needs a chat "
        "template that marks reasoning (GET /props: chat_template_caps).")
    repeat_penalty: float | None = Field(
        default=None, ge=1.0, le=2.0,
        description="llama.cpp only: sampling's repeat penalty (empty: the server's, 1.0 on "
        "llama-server). llama-cpp-python's server applied 1.1 unasked; a small model without it "
        "repeats entities until max_output_tokens.")
    max_retries: int = Field(default=4, ge=0, le=20, description="Retries on transient errors.")
    retry_base_seconds: float = Field(default=1.0, ge=0, description="First backoff delay.")

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v and not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https:// (e.g. http://127.0.0.1:9080)")
        return server_root(v) if v else v

    @model_validator(mode="after")
    def _fits(self) -> InferenceEndpoint:
        if self.max_output_tokens >= self.context_tokens // 2:
            raise ValueError(
                f"max_output_tokens ({self.max_output_tokens}) must be under half of "
                f"context_tokens ({self.context_tokens}) to leave room for the document"
            )
        budget = self.reasoning_budget_tokens
        if budget is not None and self.max_output_tokens - budget < REASONING_ANSWER_ROOM:
            raise ValueError(
                f"reasoning_budget_tokens ({budget}) leaves {self.max_output_tokens - budget} of "
                f"max_output_tokens ({self.max_output_tokens}) for the answer: thinking counts "
                f"against max_tokens — leave at least {REASONING_ANSWER_ROOM} (raise "
                f"max_output_tokens to {budget + REASONING_ANSWER_ROOM}, or lower the budget)")
        return self
