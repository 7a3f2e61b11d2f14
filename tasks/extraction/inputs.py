"""What phase 1 reads and whom it asks, from the profile's blocks: the document folders that
exist, and the inference endpoint's client, chunk size and response schema. (The blocks hold
the settings, blocks/sources.py and blocks/inference.py; the streams and the field each reads
its folder from, tasks/extraction/streams.py.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from blocks.inference import InferenceEndpoint
from blocks.sources import DocumentSources
from tasks.extraction import streams
from tasks.extraction.calls import prompt_overhead_tokens
from tasks.extraction.chunking import estimate_tokens
from tasks.extraction.llm import LLMClient
from tasks.extraction.prompt import GLEAN_PROMPT
from tasks.extraction.schema import json_schema
from tasks.graph.ontology import GraphSchema
from tasks.shared.errors import ConfigError


def source_roots(sources: DocumentSources) -> dict[str, Path]:
    """stream → folder for every configured stream, in the registry's order
    (tasks/extraction/streams.py); ConfigError for a folder that does not exist, a name in
    `other` that is no such stream, or when no stream is configured."""
    unknown = streams.unknown_others(sources)
    if unknown:
        others = [s.name for s in streams.STREAMS if not s.source_field]
        raise ConfigError(
            f"sources.other: {', '.join(unknown)} is no stream read from 'other' (those are: "
            f"{', '.join(others) or 'none'}; tasks/extraction/streams.py) — fix or remove it")
    out: dict[str, Path] = {}
    for stream, value in streams.configured(sources):
        path = Path(value).expanduser()
        if not path.is_dir():
            raise ConfigError(
                f"sources.{stream.setting}: folder {path.resolve()} does not exist — create it, "
                f"or fix '{stream.setting}' in the profile / sources block (empty disables the "
                "stream)"
            )
        out[stream.name] = path
    if not out:
        raise ConfigError(f"sources: no stream configured — set {streams.settings_text()}")
    return out


def chunk_tokens(endpoint: InferenceEndpoint, ontology: GraphSchema | None = None,
                 gleanings: int = 0) -> int:
    """Document tokens per request: the context minus the answer and the prompt, and for each
    gleaning pass the answer before it and the ask."""
    per_glean = endpoint.max_output_tokens + estimate_tokens(GLEAN_PROMPT) + 16
    return max(128, endpoint.context_tokens - endpoint.max_output_tokens
               - prompt_overhead_tokens(ontology) - gleanings * per_glean)


def response_schema(endpoint: InferenceEndpoint, ontology: GraphSchema | None = None
                    ) -> dict[str, Any]:
    """The bounded JSON schema every request asks for, its types the graph schema's."""
    return json_schema(endpoint.max_entities, endpoint.max_relationships,
                       max_description=endpoint.max_description_chars, ontology=ontology)


def llm_client(endpoint: InferenceEndpoint, base_url: str | None = None,
               base_urls: list[str] | None = None, deadline: float | None = None,
               server_exit: Callable[[], str | None] | None = None) -> LLMClient:
    """A client for this endpoint (at `base_url`, or at every URL of `base_urls` — one per
    node — when the compute nodes provide them), its ceiling max_concurrent_requests per URL.
    `deadline` (time.time() seconds): requests that cannot end by then are Deferred.
    `server_exit`: why the server this run started is gone (LLMClient.server_exit)."""
    urls = list(base_urls or []) or [base_url or endpoint.base_url or ""]
    if not urls[0]:
        raise ConfigError("inference: no endpoint — pass base_url, or set base_url in the "
                          "profile's [inference] (the nightly flow's node starts one)")
    return LLMClient(
        base_url=urls[0], more_urls=tuple(urls[1:]), deadline=deadline,
        model=endpoint.model, dialect=endpoint.dialect,
        api_key=endpoint.api_key.get_secret_value() if endpoint.api_key else None,
        max_concurrency=endpoint.max_concurrent_requests,
        timeout_seconds=endpoint.request_timeout_seconds, max_retries=endpoint.max_retries,
        retry_base_seconds=endpoint.retry_base_seconds,
        max_output_tokens=endpoint.max_output_tokens, server_exit=server_exit,
        reasoning_budget=endpoint.reasoning_budget_tokens,
        repeat_penalty=endpoint.repeat_penalty)
