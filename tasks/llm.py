"""OpenAI-compatible chat client for structured extraction.

Async with bounded concurrency (the endpoint's limit), one structured-output request shape per
dialect, reasoning stripped, retries with exponential backoff and jitter on transient errors.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from pydantic import ValidationError

from tasks.errors import ChunkTooLong, LLMError
from tasks.schema import Extraction

Dialect = Literal["vllm", "llama.cpp", "openai"]
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_CONTEXT_ERROR = re.compile(r"context|too long|maximum.*tokens|exceed", re.I)


def strip_reasoning(content: str) -> str:
    """Drop <think>…</think>; if only the closing tag is present (the chat template opened the
    block), keep what follows it. `reasoning_content` is a separate field and never read."""
    content = _THINK.sub("", content)
    low = content.lower()
    if "</think>" in low:
        content = content[low.rfind("</think>") + len("</think>"):]
    content = content.strip()
    if content.startswith("```"):  # some models fence JSON even under a JSON grammar
        content = re.sub(r"^```[a-zA-Z]*\s*|\s*```$", "", content)
    return content


def response_format(dialect: Dialect, schema: dict[str, Any]) -> dict[str, Any]:
    """The structured-output request field in the endpoint's dialect."""
    if dialect == "llama.cpp":
        # llama-cpp-python rejects "json_schema" (HTTP 500) but takes a schema here.
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema",
            "json_schema": {"name": "extraction", "schema": schema, "strict": True}}


# The server is not there (refused, or the connection dropped mid-answer): a node going away,
# not a document the model cannot handle. A timeout is not on the list: a slow answer can be
# the document's own doing.
_DOWN = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


@dataclass
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0

    def add(self, other: Usage) -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.retries += other.retries


@dataclass
class LLMClient:
    base_url: str
    model: str
    dialect: Dialect = "vllm"
    api_key: str | None = field(default=None, repr=False)  # never in logs or tracebacks
    max_concurrency: int = 8
    timeout_seconds: float = 300.0
    max_retries: int = 4
    retry_base_seconds: float = 1.0
    retry_max_seconds: float = 30.0
    max_output_tokens: int = 1024
    temperature: float = 0.0
    usage: Usage = field(default_factory=Usage)

    def __post_init__(self) -> None:
        self._sem: asyncio.Semaphore | None = None
        self._client: httpx.AsyncClient | None = None

    async def __aenter__(self) -> LLMClient:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        limits = httpx.Limits(max_connections=self.max_concurrency,
                              max_keepalive_connections=self.max_concurrency)
        self._client = httpx.AsyncClient(base_url=self.base_url.rstrip("/"), headers=headers,
                                         timeout=self.timeout_seconds, limits=limits)
        self._sem = asyncio.Semaphore(self.max_concurrency)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client:
            await self._client.aclose()
        self._client = None

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.retry_max_seconds)
            except ValueError:
                pass
        base = min(self.retry_max_seconds, self.retry_base_seconds * 2**attempt)
        return base * random.uniform(0.5, 1.5)

    async def extract(self, system: str, user: str, schema: dict[str, Any]) -> Extraction:
        """One chunk in, validated Extraction out. Raises ChunkTooLong when the model ran out
        of tokens or context (split and retry), LLMError when retries are exhausted."""
        assert self._client is not None and self._sem is not None, "use 'async with LLMClient'"
        body = {
            "model": self.model,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}],
            "temperature": self.temperature,
            "max_tokens": self.max_output_tokens,
            "response_format": response_format(self.dialect, schema),
        }
        last_error = "no attempt made"
        down = False
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.usage.retries += 1
            retry_after = None
            self.usage.calls += 1
            try:
                async with self._sem:
                    resp = await self._client.post("/v1/chat/completions", json=body)
            except (httpx.TransportError, httpx.TimeoutException) as e:
                last_error = f"{type(e).__name__}: {e}"
                down = isinstance(e, _DOWN)
            else:
                down = False
                if resp.status_code == 200:
                    try:
                        return self._parse(resp.json())
                    except ValidationError as e:
                        # Truncated or off-schema JSON without a 'length' finish: the model
                        # may do better on another sample.
                        err = e.errors()[0]
                        where = ".".join(str(x) for x in err["loc"]) or "(root)"
                        last_error = f"unusable output: {where}: {err['msg']}"
                    except (json.JSONDecodeError, KeyError, TypeError, IndexError) as e:
                        last_error = f"malformed response: {type(e).__name__}: {e}"
                elif resp.status_code == 400 and _CONTEXT_ERROR.search(resp.text):
                    raise ChunkTooLong(f"endpoint rejected the prompt as too long: "
                                       f"{resp.text[:200]}", attempt + 1)
                elif resp.status_code in _RETRY_STATUS:
                    last_error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                    retry_after = resp.headers.get("retry-after")
                else:
                    raise LLMError(f"HTTP {resp.status_code} from {self.base_url}: "
                                   f"{resp.text[:300]} — check the inference block's model "
                                   "and dialect", attempt + 1)
            if attempt < self.max_retries:
                await asyncio.sleep(self._backoff(attempt, retry_after))
        raise LLMError(f"gave up after {self.max_retries + 1} attempts: {last_error}",
                       self.max_retries + 1, endpoint_down=down)

    def _parse(self, payload: dict[str, Any]) -> Extraction:
        choice = payload["choices"][0]
        usage = payload.get("usage") or {}
        self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.usage.completion_tokens += int(usage.get("completion_tokens") or 0)
        if choice.get("finish_reason") == "length":
            raise ChunkTooLong("the model hit max_tokens before closing the JSON")
        content = strip_reasoning(choice["message"].get("content") or "")
        # strict=False: small models put raw newlines inside JSON strings; grammars allow it.
        return Extraction.model_validate(json.loads(content, strict=False))
