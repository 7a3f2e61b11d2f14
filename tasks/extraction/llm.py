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
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import httpx
from pydantic import ValidationError

from blocks.inference import server_root
from tasks.errors import ChunkTooLong, LLMError
from tasks.extraction.schema import Extraction, SchemaViolation, parse_answer

Dialect = Literal["vllm", "llama.cpp", "openai"]
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_CONTEXT_ERROR = re.compile(r"context|too long|maximum.*tokens|exceed", re.I)
# A resend of an unusable answer at temperature 0 gets the same answer back (greedy decoding
# is deterministic): each such retry samples a step hotter, with a seed of its own.
RETRY_TEMPERATURE_STEP = 0.3


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


def _retry_after_seconds(value: str) -> float | None:
    """A Retry-After header's delay: delta-seconds or an HTTP date (RFC 9110 10.2.3)."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return (when - datetime.now(UTC)).total_seconds() if when.tzinfo else None


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
    # answers that broke the schema (or were no JSON), by reason: {"entities: maxItems": 2}
    unusable_answers: dict[str, int] = field(default_factory=dict)

    def add(self, other: Usage) -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.retries += other.retries
        for reason, n in other.unusable_answers.items():
            self.unusable(reason, n)

    def unusable(self, reason: str, n: int = 1) -> None:
        self.unusable_answers[reason] = self.unusable_answers.get(reason, 0) + n


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
        self._client = httpx.AsyncClient(base_url=server_root(self.base_url), headers=headers,
                                         timeout=self.timeout_seconds, limits=limits)
        self._sem = asyncio.Semaphore(self.max_concurrency)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client:
            await self._client.aclose()
        self._client = None

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        """Seconds to wait before the next attempt: what a Retry-After header says (seconds or
        an HTTP date), else exponential backoff with jitter; at most retry_max_seconds."""
        if retry_after:
            wait = _retry_after_seconds(retry_after)
            if wait is not None:
                return min(max(wait, 0.0), self.retry_max_seconds)
        base = min(self.retry_max_seconds, self.retry_base_seconds * 2**attempt)
        return base * random.uniform(0.5, 1.5)

    def sampling(self, resend: int) -> dict[str, Any]:
        """Sampling for the request: greedy first; the n-th resend of an unusable answer a step
        hotter (at most 1.0) with seed n — vLLM and llama.cpp's server both take `seed`."""
        if not resend:
            return {"temperature": self.temperature}
        return {"temperature": min(1.0, self.temperature + RETRY_TEMPERATURE_STEP * resend),
                "seed": resend}

    def _transport_error(self, e: Exception) -> str:
        """What went wrong on the wire, naming the URL and the limit (httpx's own message is
        often empty: 'ReadTimeout: ')."""
        url = f"{server_root(self.base_url)}/v1/chat/completions"
        within = f"within {self.timeout_seconds:g} s (request_timeout_seconds)"
        timeouts: dict[type[Exception], str] = {
            httpx.ConnectTimeout: f"could not connect to {url} {within} — is the server up?",
            httpx.ReadTimeout: f"no answer from {url} {within} — raise the inference block's "
                               "request_timeout_seconds, or lower max_output_tokens",
            httpx.WriteTimeout: f"could not send the request to {url} {within}",
            httpx.PoolTimeout: f"no free connection to {url} {within}",
        }
        others: dict[type[Exception], str] = {
            httpx.ConnectError: f"could not connect to {url}",
            httpx.RemoteProtocolError: f"{url} closed the connection mid-answer",
            httpx.ReadError: f"the connection to {url} broke mid-answer",
        }
        detail = timeouts.get(type(e))
        if detail is None:
            detail = others.get(type(e), f"request to {url} failed")
            detail += f" ({e})" if str(e).strip() else ""
        return f"{type(e).__name__}: {detail}"

    async def extract(self, system: str, user: str, schema: dict[str, Any]) -> Extraction:
        """One chunk in, an answer held to every bound of `schema` out. Raises ChunkTooLong
        when the model ran out of tokens or context (split and retry), LLMError when retries
        are exhausted (an unusable answer is retried with other sampling)."""
        assert self._client is not None and self._sem is not None, "use 'async with LLMClient'"
        body = {
            "model": self.model,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}],
            "max_tokens": self.max_output_tokens,
            "response_format": response_format(self.dialect, schema),
        }
        last_error = "no attempt made"
        down = False
        resend = 0  # unusable answers so far: each one changes the next request's sampling
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.usage.retries += 1
            retry_after = None
            self.usage.calls += 1
            try:
                async with self._sem:
                    resp = await self._client.post("/v1/chat/completions",
                                                   json={**body, **self.sampling(resend)})
            except (httpx.TransportError, httpx.TimeoutException) as e:
                last_error = self._transport_error(e)
                down = isinstance(e, _DOWN)
            else:
                down = False
                if resp.status_code == 200:
                    try:
                        return self._parse(resp.json(), schema)
                    except SchemaViolation as e:
                        # Off-schema JSON (the server did not hold the model to the schema):
                        # another sample may do better.
                        self.usage.unusable(e.bound)
                        last_error = (f"unusable output: {e} — the answer breaks the schema "
                                      "the request sent")
                        resend += 1
                    except ValidationError as e:
                        err = e.errors()[0]
                        where = ".".join(str(x) for x in err["loc"]) or "(answer)"
                        self.usage.unusable(f"{re.sub(r'[.]([0-9]+)', '[]', where)}: "
                                            f"{err['type']}")
                        last_error = f"unusable output: {where}: {err['msg']}"
                        resend += 1
                    except json.JSONDecodeError as e:  # truncated JSON without a 'length' finish
                        self.usage.unusable("not JSON")
                        last_error = f"malformed response: {type(e).__name__}: {e}"
                        resend += 1
                    except (KeyError, TypeError, IndexError) as e:
                        last_error = (f"malformed response: {type(e).__name__}: {e} — not an "
                                      "OpenAI chat completion; check the inference block's "
                                      "base_url and dialect")
                elif resp.status_code == 400 and _CONTEXT_ERROR.search(resp.text):
                    raise ChunkTooLong(f"endpoint rejected the prompt as too long: "
                                       f"{resp.text[:200]}", attempt + 1)
                elif resp.status_code in _RETRY_STATUS:
                    last_error = f"HTTP {resp.status_code}: {resp.text[:200] or '(empty body)'}"
                    retry_after = resp.headers.get("retry-after")
                else:
                    raise LLMError(f"HTTP {resp.status_code} from {self.base_url}: "
                                   f"{resp.text[:300] or '(empty body)'} — check the inference "
                                   "block's model and dialect", attempt + 1)
            if attempt < self.max_retries:
                await asyncio.sleep(self._backoff(attempt, retry_after))
        raise LLMError(f"gave up after {self.max_retries + 1} attempts: {last_error}",
                       self.max_retries + 1, endpoint_down=down)

    def _parse(self, payload: dict[str, Any], schema: dict[str, Any]) -> Extraction:
        choice = payload["choices"][0]
        usage = payload.get("usage") or {}
        self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.usage.completion_tokens += int(usage.get("completion_tokens") or 0)
        if choice.get("finish_reason") == "length":
            raise ChunkTooLong("the model hit max_tokens before closing the JSON")
        content = strip_reasoning(choice["message"].get("content") or "")
        # strict=False: small models put raw newlines inside JSON strings; grammars allow it.
        return parse_answer(json.loads(content, strict=False), schema)
