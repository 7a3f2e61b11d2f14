"""OpenAI-compatible chat client for structured extraction.

Async, paced per endpoint (tasks/extraction/pacing.py: a concurrency limit found by measuring,
under the block's ceiling; timeouts sized from the measured decode rate; a deadline gate), one
structured-output request shape per dialect, reasoning stripped, retries with exponential
backoff and jitter on transient errors, each retry free to go to another endpoint.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal, TypeVar

import httpx
from pydantic import ValidationError

from blocks.inference import server_root
from tasks.extraction.pacing import Outcome, Pacing
from tasks.extraction.schema import Extraction, SchemaViolation, parse_answer
from tasks.graph.ontology import GraphSchema
from tasks.shared.errors import ChunkTooLong, Deferred, LLMError, ServerDied
from tasks.shared.waiting import backoff_seconds

Dialect = Literal["vllm", "llama.cpp", "openai"]
A = TypeVar("A")  # what a reader makes of the model's JSON
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
# Statuses that say the server (or a proxy) had no room or time for the request: the model
# never saw it. (A 500 may be the document's doing: it counts as an answer.)
_NOT_ANSWERED = {408, 429, 502, 503, 504}
_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_CONTEXT_ERROR = re.compile(r"context|too long|maximum.*tokens|exceed", re.I)
# A resend of an unusable answer at temperature 0 gets the same answer back (greedy decoding
# is deterministic): each such retry samples a step hotter, with a seed of its own.
RETRY_TEMPERATURE_STEP = 0.3


def strip_reasoning(content: str) -> str:
    """Drop <think>…</think>; if only the closing tag is present (the chat template opened the
    block), keep what follows it; an opening tag alone is dropped. `reasoning_content` is a
    separate field and never read."""
    content = _THINK.sub("", content)
    low = content.lower()
    if "</think>" in low:
        content = content[low.rfind("</think>") + len("</think>"):]
    # an opening tag only: the template opened the block and a grammar held the model to JSON
    # from its first token (llama-server with reasoning_format none gives the tag back)
    content = re.sub(r"^\s*<think>", "", content, flags=re.I).strip()
    if content.startswith("```"):  # some models fence JSON even under a JSON grammar
        content = re.sub(r"^```[a-zA-Z]*\s*|\s*```$", "", content)
    return content


def response_format(dialect: Dialect, schema: dict[str, Any]) -> dict[str, Any]:
    """The structured-output request field in the endpoint's dialect."""
    if dialect == "llama.cpp":
        # llama-server takes this and OpenAI's json_schema form alike (llama-cpp-python's
        # server only this one: json_schema is an HTTP 500 there).
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema",
            "json_schema": {"name": "extraction", "schema": schema, "strict": True}}


@functools.cache
def _compact_grammar(schema_json: str) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return json_schema_to_gbnf(schema_json)


def structured_output(dialect: Dialect, schema: dict[str, Any], reasoning: bool = False
                      ) -> dict[str, Any]:
    """The request fields that hold the answer to `schema`.

    For llama.cpp without reasoning: a GBNF grammar of the schema in which JSON has no
    whitespace but one optional space (llama-cpp-python's converter, llama_grammar.py). The
    server's own conversion of a JSON schema allows a newline and 20 spaces of indent between
    any two tokens, and small models take them: measured on the example documents, every
    SmolLM2 answer then ran to max_tokens 384 (cut off), against 218 tokens on average
    compact. With a reasoning budget the server's own conversion is needed: it lets the
    grammar start after the thinking. Elsewhere: the dialect's response_format."""
    if dialect == "llama.cpp" and not reasoning:
        # reasoning_format none: with a template that opens <think> for the model, the
        # server's reasoning parser would take the whole (grammar-held) answer for thinking
        # and return an empty content (measured with the tiny OLMo 3)
        return {"grammar": _compact_grammar(json.dumps(schema, sort_keys=True)),
                "reasoning_format": "none"}
    return {"response_format": response_format(dialect, schema)}


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


def _completion_tokens(resp: httpx.Response) -> int:
    """usage.completion_tokens of a 200 answer, 0 when absent or unreadable."""
    try:
        return int((resp.json().get("usage") or {}).get("completion_tokens") or 0)
    except (ValueError, TypeError, AttributeError):
        return 0


async def _adapter_setting(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    """llama-server's loaded adapters as a request's `lora` list ([{"id", "scale"}], [] when
    none); [] too when the server has no /lora-adapters (another engine) or is not up yet."""
    try:
        r = await client.get("/lora-adapters", timeout=10.0)
        items = r.json() if r.status_code == 200 else []
        return [{"id": int(a["id"]), "scale": float(a.get("scale", 1.0))} for a in items]
    except (httpx.HTTPError, ValueError, TypeError, KeyError):
        return []


async def _streamed(client: httpx.AsyncClient, payload: dict[str, Any],
                    seconds: float) -> httpx.Response:
    """A chat completion from llama-server, streamed, reassembled into the plain answer's shape.

    Streamed because llama-server cancels a task whose client went away only while it streams
    (measured on this build: a non-streamed request kept its slot for all of its 3,000 tokens
    after the socket closed; a streamed one freed it at once). So a request that times out
    here ends on the server too, and its retry does not queue behind it. `seconds` bounds the
    whole answer (httpx's own read timeout would only bound the gap between two chunks)."""
    content: list[str] = []
    finish, usage = None, None
    try:
        async with asyncio.timeout(seconds):
            async with client.stream("POST", "/v1/chat/completions", timeout=seconds,
                                     json={**payload, "stream": True,
                                           "stream_options": {"include_usage": True}}) as r:
                if r.status_code != 200:
                    await r.aread()
                    return r
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: "):].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        content.append((choice.get("delta") or {}).get("content") or "")
                        finish = choice.get("finish_reason") or finish
    except TimeoutError as e:
        raise httpx.ReadTimeout(f"no complete answer within {seconds:.3g} s") from e
    body = {"choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": "".join(content)}}],
            "usage": usage or {}}
    return httpx.Response(200, json=body, request=r.request)


# The server is not there (refused, or the connection dropped mid-answer): a node going away,
# not a document the model cannot handle. A timeout is not on the list: a slow answer can be
# the document's own doing.
_DOWN = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


@dataclass
class Usage:
    """What a client's calls used: requests, tokens both ways, retries, unusable answers."""

    calls: int = 0
    retries: int = 0
    # answers that broke the schema (or were no JSON), by reason: {"entities: maxItems": 2}
    unusable_answers: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0

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
class _Attempts:
    """What one chunk's attempts have found so far (LLMClient.extract)."""

    last_error: str = "no attempt made"
    down: bool = False  # the last attempt found the server gone (a transport error of _DOWN)
    cut: bool = False  # the last answer was cut at max_tokens (resample_cut)
    answered: bool = False  # some attempt got an answer from the model (usable or not)
    resend: int = 0  # unusable answers so far: each one changes the next request's sampling
    url: str = ""  # the endpoint the last attempt went to


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
    # extra endpoints (one per node): each request goes to the one with the most free room
    more_urls: tuple[str, ...] = ()
    # False: a fixed limit of max_concurrency per endpoint (the bench's sweep); True: found
    adaptive: bool = True
    # time.time() by which every request must have ended: Deferred instead of a request
    # whose estimated latency does not fit (no HTTP call)
    deadline: float | None = None
    # limits and measurements, shared by copies (replace(client, usage=Usage())): built once
    pacing: Pacing | None = field(default=None, repr=False, compare=False)
    # When the endpoint is a server this run started: why it is gone (None while it runs).
    # Asked when a request finds the server down; an answer ends the work (ServerDied)
    # instead of retrying a dead port for every document.
    server_exit: Callable[[], str | None] | None = field(default=None, repr=False,
                                                         compare=False)
    # llama-server's per-request reasoning budget (`reasoning_budget_tokens`): a Think model
    # thinks up to this many tokens into `reasoning_content`, then answers in `content` under
    # the schema. None: no reasoning (the grammar holds from the first token).
    reasoning_budget: int | None = None
    # llama.cpp's repeat penalty, sent with every request when set
    repeat_penalty: float | None = None

    def __post_init__(self) -> None:
        self._clients: dict[str, httpx.AsyncClient] = {}
        # per endpoint, the `lora` list every request names (llama-server only): the adapters
        # the server has loaded, at the scales it holds — explicit, so no request reuses a
        # prompt cache computed under another adapter setting (upstream #26207)
        self._lora: dict[str, list[dict[str, Any]]] = {}
        if self.pacing is None:
            self.pacing = Pacing(self.base_urls, self.max_concurrency, self.adaptive)

    @property
    def base_urls(self) -> tuple[str, ...]:
        return (self.base_url, *self.more_urls)

    def stats(self) -> dict[str, dict[str, float | int | None]]:
        """Per endpoint URL: requests sent, completion_tokens, limit (now), peak_limit,
        decode_tokens_per_s (one request's measured rate; None before any usage), timeouts,
        busy (429/503) and refused (connection failures) — over the client's lifetime."""
        assert self.pacing is not None
        return self.pacing.stats()

    async def __aenter__(self) -> LLMClient:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        limits = httpx.Limits(max_connections=self.max_concurrency,
                              max_keepalive_connections=self.max_concurrency)
        self._clients = {u: httpx.AsyncClient(base_url=server_root(u), headers=headers,
                                              timeout=self.timeout_seconds, limits=limits)
                         for u in self.base_urls}
        if self.dialect == "llama.cpp":
            for url, c in self._clients.items():
                self._lora[url] = await _adapter_setting(c)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for c in self._clients.values():
            await c.aclose()
        self._clients = {}

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        """Seconds to wait before the next attempt: what a Retry-After header says (seconds or
        an HTTP date), else exponential backoff with full jitter; at most retry_max_seconds."""
        if retry_after:
            wait = _retry_after_seconds(retry_after)
            if wait is not None:
                return min(max(wait, 0.0), self.retry_max_seconds)
        return backoff_seconds(attempt, self.retry_base_seconds, self.retry_max_seconds)

    def sampling(self, resend: int) -> dict[str, Any]:
        """Sampling for the request: greedy first; the n-th resend of an unusable answer a step
        hotter (at most 1.0) with seed n — vLLM and llama.cpp's server both take `seed`."""
        penalty = {"repeat_penalty": self.repeat_penalty} if self.repeat_penalty else {}
        if not resend:
            return {"temperature": self.temperature, **penalty}
        return {"temperature": min(1.0, self.temperature + RETRY_TEMPERATURE_STEP * resend),
                "seed": resend, **penalty}

    def _transport_error(self, e: Exception, base_url: str | None = None,
                         timeout: tuple[float, str] | None = None) -> str:
        """What went wrong on the wire, naming the URL and the limit (httpx's own message is
        often empty: 'ReadTimeout: ')."""
        url = f"{server_root(base_url or self.base_url)}/v1/chat/completions"
        seconds, why = timeout or (self.timeout_seconds, "request_timeout_seconds")
        within = f"within {seconds:.3g} s ({why})"
        fix = ("raise the inference block's request_timeout_seconds, or lower max_output_tokens"
               if why == "request_timeout_seconds" else
               "the server slowed down (another tenant, longer prompts?): lower "
               "max_output_tokens or max_concurrent_requests")
        timeouts: dict[type[Exception], str] = {
            httpx.ConnectTimeout: f"could not connect to {url} {within} — is the server up?",
            httpx.ReadTimeout: f"no answer from {url} {within} — {fix}",
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

    async def extract(self, system: str, user: str, schema: dict[str, Any],
                      resample_cut: bool = False, history: list[dict[str, str]] | None = None,
                      ontology: GraphSchema | None = None) -> Extraction:
        """One chunk in, an answer held to every bound of `schema` out. Raises ChunkTooLong
        when the model ran out of tokens or context (split and retry), LLMError when retries
        are exhausted (an unusable answer is retried with other sampling), Deferred when the
        deadline cannot cover the next attempt (before sending it, or before a backoff).
        `resample_cut`: the chunk cannot be split further, so an answer cut at max_tokens is
        treated as unusable (resent with other sampling) before ChunkTooLong is raised.
        `history`: messages after the user's (a gleaning pass: the first answer, then the ask
        for what it missed). `ontology`: the graph schema the answer's labels map onto."""
        return await self.ask(self.request_body(system, user, schema, history),
                              functools.partial(parse_answer, schema=schema, ontology=ontology),
                              resample_cut)

    async def ask(self, body: dict[str, Any], read: Callable[[Any], A],
                  resample_cut: bool = False) -> A:
        """`body` sent until `read` takes the model's JSON (it raises SchemaViolation or
        pydantic's ValidationError for an unusable answer), with extract's errors and retries.

        Each attempt: `_send` (paced, to the endpoint with room), `_judge` (the answer read, or
        why not), then `_wait_to_retry`; `_given_up` says why when none was usable."""
        assert self._clients and self.pacing is not None, "use 'async with LLMClient'"
        tries = _Attempts()
        for attempt in range(self.max_retries + 1):
            tries.cut = False  # (of this attempt: the last one decides what is raised)
            resp = await self._send(body, attempt, tries)
            retry_after = None
            if resp is not None:
                answer, retry_after = self._judge(resp, read, resample_cut, attempt, tries)
                if answer is not None:
                    return answer
            if attempt < self.max_retries:
                await self._wait_to_retry(attempt, retry_after, tries.last_error)
        raise self._given_up(tries)

    def request_body(self, system: str, user: str, schema: dict[str, Any],
                     history: list[dict[str, str]] | None = None) -> dict[str, Any]:
        """The request every attempt sends (before its sampling and lora list): the messages,
        max_tokens, the dialect's structured output for `schema`, the reasoning budget."""
        body = {
            "model": self.model,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}, *(history or [])],
            "max_tokens": self.max_output_tokens,
            **structured_output(self.dialect, schema, self.reasoning_budget is not None),
        }
        if self.reasoning_budget is not None:
            body["reasoning_budget_tokens"] = self.reasoning_budget
        return body

    async def _send(self, body: dict[str, Any], attempt: int,
                    tries: _Attempts) -> httpx.Response | None:
        """One attempt on the wire, paced: the response, or None after a transport error
        (recorded in `tries`); ServerDied when the server this run started is gone."""
        assert self.pacing is not None
        ep, ticket = await self.pacing.acquire(self.deadline, self.max_output_tokens,
                                               self.timeout_seconds)
        if attempt:
            self.usage.retries += 1
        self.usage.calls += 1
        timeout = ep.timeout(self.max_output_tokens, self.timeout_seconds)
        tries.url = ep.url
        lora = self._lora.get(ep.url)
        payload = {**body, **self.sampling(tries.resend), **({"lora": lora} if lora else {})}
        try:
            if self.dialect == "llama.cpp":
                resp = await _streamed(self._clients[ep.url], payload, timeout[0])
            else:
                resp = await self._clients[ep.url].post(
                    "/v1/chat/completions", timeout=timeout[0], json=payload)
        except (httpx.TransportError, httpx.TimeoutException) as e:
            tries.last_error = self._transport_error(e, ep.url, timeout)
            tries.down = isinstance(e, _DOWN)
            # (in a thread: it may wait a moment for a server that is still exiting)
            died = await asyncio.to_thread(self.server_exit) \
                if tries.down and self.server_exit else None
            if died:
                await self.pacing.release(ep, ticket, "down")
                raise ServerDied(f"{died}\n(the request to {ep.url} failed: "
                                 f"{tries.last_error})") from e
            outcome: Outcome = ("down" if tries.down or isinstance(e, httpx.ConnectTimeout)
                                else "timeout" if isinstance(e, httpx.TimeoutException)
                                else "other")
            await self.pacing.release(ep, ticket, outcome)
            return None
        tries.down = False
        if resp.status_code not in _NOT_ANSWERED:
            tries.answered = True
        tokens = 0
        outcome = "other"
        if resp.status_code == 200:
            outcome, tokens = "ok", _completion_tokens(resp)
        elif resp.status_code in (429, 503):
            outcome = "busy"  # the server says it is full: a signal for its limit
        await self.pacing.release(ep, ticket, outcome, tokens)
        return resp

    def _judge(self, resp: httpx.Response, read: Callable[[Any], A], resample_cut: bool,
               attempt: int, tries: _Attempts) -> tuple[A | None, str | None]:
        """(the answer, None) when usable; (None, Retry-After) when another attempt may do
        better (why: `tries.last_error`); raises what no retry can mend."""
        if resp.status_code == 200:
            try:
                return self._parse(resp.json(), read), None
            except ChunkTooLong as e:
                if not resample_cut:
                    raise
                # greedy decoding that loops (a small model repeating an entity) ends at
                # max_tokens every time; another sample may close the JSON
                self._unusable(tries, "(answer): cut at max_tokens", str(e))
                tries.cut = True
            except SchemaViolation as e:
                # Off-schema JSON (the server did not hold the model to the schema): another
                # sample may do better.
                self._unusable(tries, e.bound, f"unusable output: {e} — the answer breaks the "
                               "schema the request sent")
            except ValidationError as e:
                err = e.errors()[0]
                where = ".".join(str(x) for x in err["loc"]) or "(answer)"
                self._unusable(tries, f"{re.sub(r'[.]([0-9]+)', '[]', where)}: {err['type']}",
                               f"unusable output: {where}: {err['msg']}")
            except json.JSONDecodeError as e:  # truncated JSON without a 'length' finish
                self._unusable(tries, "not JSON",
                               f"malformed response: {type(e).__name__}: {e}")
            except (KeyError, TypeError, IndexError) as e:
                tries.last_error = (f"malformed response: {type(e).__name__}: {e} — not an "
                                    "OpenAI chat completion; check the inference block's "
                                    "base_url and dialect")
            return None, None
        if resp.status_code == 400 and _CONTEXT_ERROR.search(resp.text):
            raise ChunkTooLong(f"endpoint rejected the prompt as too long: {resp.text[:200]}",
                               attempt + 1)
        if resp.status_code in _RETRY_STATUS:
            tries.last_error = f"HTTP {resp.status_code}: {resp.text[:200] or '(empty body)'}"
            return None, resp.headers.get("retry-after")
        raise LLMError(f"HTTP {resp.status_code} from {tries.url}: "
                       f"{resp.text[:300] or '(empty body)'} — check the inference block's "
                       "model and dialect", attempt + 1)

    def _unusable(self, tries: _Attempts, reason: str, error: str) -> None:
        """An answer that cannot be used: counted by reason, resent with other sampling."""
        self.usage.unusable(reason)
        tries.last_error = error
        tries.resend += 1

    async def _wait_to_retry(self, attempt: int, retry_after: str | None,
                             last_error: str) -> None:
        """The backoff before the next attempt; Deferred when it would end past the
        deadline."""
        assert self.pacing is not None
        wait = self._backoff(attempt, retry_after)
        if self.deadline is not None and time.time() + wait + self.pacing.min_estimate(
                self.max_output_tokens, self.timeout_seconds) > self.deadline:
            raise Deferred(f"a retry after {wait:.1f} s would end past the deadline "
                           f"(last attempt: {last_error})")
        await asyncio.sleep(wait)

    def _given_up(self, tries: _Attempts) -> Exception:
        """Why every attempt failed: ChunkTooLong when the last was cut at max_tokens, else
        LLMError (whether the endpoint was down, whether the model answered at all)."""
        if tries.cut:
            return ChunkTooLong(f"{tries.last_error} (also after {tries.resend - 1} resends "
                                "with other sampling)", self.max_retries + 1)
        return LLMError(f"gave up after {self.max_retries + 1} attempts: {tries.last_error}",
                        self.max_retries + 1, endpoint_down=tries.down,
                        unanswered=not tries.answered)

    def _parse(self, payload: dict[str, Any], read: Callable[[Any], A]) -> A:
        choice = payload["choices"][0]
        usage = payload.get("usage") or {}
        self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.usage.completion_tokens += int(usage.get("completion_tokens") or 0)
        if choice.get("finish_reason") == "length":
            raise ChunkTooLong("the model hit max_tokens before closing the JSON")
        content = strip_reasoning(choice["message"].get("content") or "")
        # strict=False: small models put raw newlines inside JSON strings; grammars allow it.
        return read(json.loads(content, strict=False))
