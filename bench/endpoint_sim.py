"""An OpenAI-compatible inference server simulated in time: a GPU (or CPU) serving one model with
continuous batching and a paged KV cache, run `speed` times faster than real time so that a
bench covers a night's shape in minutes. A helper for the benches, not a bench itself.

    python bench/endpoint_sim.py --preset l4-32b-q3 --speed 100   # prints its URL, serves

What it models, and after which document:
- Scheduling follows vLLM V1's scheduler (vllm/v1/core/sched/scheduler.py, v0.10-v0.11,
  `Scheduler.schedule`), FCFS policy: every step first gives each running request its next
  token (or its next prefill chunk) in admission order; when the KV cache has no free block for
  it, the NEWEST running request is preempted (`self.running.pop()`): its blocks are freed, its
  computed tokens reset to 0 and it goes back to the FRONT of the waiting queue, to be recomputed
  (prompt and the tokens it had written) when it is admitted again (preemption mode RECOMPUTE,
  the V1 default; docs.vllm.ai "Optimization and Tuning", Preemption). Waiting requests are
  admitted in order while the step's token budget (max_num_batched_tokens: chunked prefill),
  max_num_seqs and free blocks allow, and only in a step that preempted nothing.
- The KV cache is paged in blocks of 16 tokens (vLLM's default block_size); a request holds
  ceil(tokens in cache / 16) blocks. Admission looks only at the prompt, so the cache can
  over-commit as answers grow: that is what makes preemption happen on a real server.
- A step's time is what a memory-bound decode costs: reading the weights once (the base), a
  per-sequence compute cost, reading each scheduled sequence's KV, plus the prefill tokens of
  the step at the prefill rate. Aggregate tokens/s = b / step(b) rises with the batch and
  flattens; each stream's rate falls as the batch grows.
- A request whose client disconnects is aborted and its blocks freed (vLLM's OpenAI server
  wraps its handlers in `with_cancellation`, vllm/entrypoints/utils.py). No 429: vLLM and
  llama.cpp's server queue what they cannot run.
- A prompt longer than the context (prompt + max_tokens > max_model_len) is refused with
  HTTP 400 and vLLM's message ("This model's maximum context length is …").
- Preset l4-32b-q3-llama-server is llama-server as profiles/gcp.toml starts it: fixed slots,
  each with its share of the cache (no paging, no preemption), the rest queued (no 429), its
  own context error (see the preset's comment).
What it does not model: prefix caching, speculative decoding, sampling cost, the HTTP server's
own CPU.

The answer: its length in output tokens is drawn per prompt (seeded by a hash of the messages
and the request's seed) in the preset's [lo, hi]; capped by max_tokens with finish_reason
"length" (the JSON is then cut, as a real model's would be). The content is a <think> block
padded to that length (≈ 4 characters a token) followed by the extraction JSON that
bench/_fakes.py's extraction_for gives for the user message. Prompt tokens are estimated as
len(text) / 4 over all messages + 8 per message for the chat template.

Control (not OpenAI): GET /sim/stats; POST /sim/capacity {"factor": 0.5} (a second tenant takes
that share of the KV cache and of the compute: blocks and speed scale by factor; running
requests over the new capacity are preempted as above); POST /sim/reset (fresh engine and
stats, factor 1, while idle).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fakes import extraction_for  # noqa: E402

BLOCK_TOKENS = 16
CHARS_PER_TOKEN = 4
TEMPLATE_TOKENS_PER_MESSAGE = 8


@dataclass(frozen=True)
class Preset:
    model: str
    step_base_s: float          # weights read once per step
    step_per_seq_s: float       # compute per sequence per step
    kv_read_s_per_token: float  # reading one cached token's K and V
    prefill_tokens_per_s: float
    kv_tokens: int              # KV cache capacity, tokens
    max_num_seqs: int
    max_batched_tokens: int     # per step (chunked prefill budget)
    max_model_len: int
    output_tokens: tuple[int, int]  # an answer's length: lo, hi
    # llama-server: a fixed share of the KV cache per slot (-np slots -c slots x slot_tokens),
    # no paging and no preemption; None: vLLM's paged cache
    slot_tokens: int | None = None


# l4-32b-q3: one NVIDIA L4 (24 GB GDDR6, ~300 GB/s) serving OLMo 3 32B Think at Q3_K_M.
# - Weights ≈ 15.5 GB (the Q3_K_M GGUF of a 32B model): a decode step reads them all, 15.5 /
#   300 = 51.7 ms, ~19 tokens/s for one stream.
# - Per sequence ≈ 2.5 ms a step: 2 × 32e9 = 64 GFLOP a token at ~25 TFLOP/s, what the L4's
#   fp16 tensor cores give through llama.cpp's/vLLM's dequantising Q3 kernels (an estimate).
# - KV per token, f16: 2 (K, V) × 64 layers × 8 KV heads × 128 head dim × 2 bytes = 262,144
#   bytes (OLMo 2 32B's config, which OLMo 3 32B keeps: hidden 5120, 40 query heads, 8 KV
#   heads; OLMo 3's 4096-token sliding window on 3 layers in 4 saves nothing below 4096 tokens
#   a sequence, and ours are shorter). Reading it: 262,144 / 300e9 = 0.87 µs a token a step.
# - KV capacity: 24.15e9 bytes on the card − 15.6e9 weights − ~2.2e9 CUDA context, compute
#   buffers and fragmentation ≈ 6.3e9 bytes / 262,144 ≈ 24,000 tokens: ~9 sequences of a
#   1,300-token prompt and a 1,400-token answer.
# - Prefill ≈ 800 tokens/s (64 GFLOP a token at ~50 TFLOP/s: compute-bound, batched).
# - Answers: a Think model reasons before the JSON, 700-2,000 tokens; the shipped profile's
#   max_output_tokens (3072) never caps them, context_tokens 8192 = max_model_len.
# cpu-small: a 135M-360M model (SmolLM2-class) on 2 CPU cores: ~30 tokens/s writing one stream,
# ~200 tokens/s reading; the cores are already busy with one sequence, so a batch barely helps
# (per-sequence compute dominates the step); answers without reasoning, 80-300 tokens.
# l4-32b-q3-llama-server: the same card and model under llama-server as profiles/gcp.toml runs
# it (tools/server of the vendored llama.cpp): 8 slots of 8192 tokens (-np 8 -c 65536, q8_0 KV);
# each slot owns its share of the cache from the start (no paging, never preempted); requests
# beyond the 8 slots wait in its queue, never a 429; a prompt + max_tokens over the slot's
# share is refused with HTTP 400 exceed_context_size_error; a disconnect cancels the task
# and frees the slot. Batch of micro-batch 512 (-ub): the prefill budget per step.
PRESETS: dict[str, Preset] = {
    "l4-32b-q3": Preset("olmo-3-32b-think", 0.0517, 0.0025, 262_144 / 300e9, 800.0, 24_000, 256,
                        2048, 8192, (700, 2000)),
    "l4-32b-q3-llama-server": Preset("olmo-3-32b-think", 0.0517, 0.0025, 139_264 / 300e9,
                                     800.0, 65_536, 8, 512, 8192, (700, 2000),
                                     slot_tokens=8192),
    "cpu-small": Preset("smollm2-360m", 0.008, 0.025, 0.0, 200.0, 16_384, 8, 512, 8192,
                        (80, 300)),
}


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "")) // CHARS_PER_TOKEN + TEMPLATE_TOKENS_PER_MESSAGE
               for m in messages)


def answer_tokens(messages: list[dict[str, Any]], seed: Any, lo: int, hi: int) -> int:
    key = json.dumps([m.get("content") for m in messages]) + f"|{seed}"
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return lo + h % (hi - lo + 1)


@dataclass(eq=False)
class Request:
    prompt: int
    target: int                 # tokens to write (already capped by max_tokens)
    arrival: float              # sim seconds
    done: asyncio.Future[float]
    generated: int = 0
    computed: int = 0           # tokens in the KV cache
    blocks: int = 0
    first_scheduled: float | None = None
    preemptions: int = 0
    aborted: bool = False

    @property
    def to_compute(self) -> int:
        """Tokens that must be in the cache before the next token can be written."""
        return self.prompt + self.generated


@dataclass
class Stats:
    requests_done: int = 0
    requests_aborted: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    recomputed_tokens: int = 0
    busy_seconds: float = 0.0
    steps: int = 0
    admitted: int = 0
    preemptions: int = 0
    max_running: int = 0
    max_in_flight: int = 0
    queue_wait_total: float = 0.0
    queue_wait_max: float = 0.0
    capacity_changes: list[dict[str, float]] = field(default_factory=list)


class Engine:
    """The scheduler and the model in simulated seconds (see the module docstring)."""

    def __init__(self, preset: Preset, factor: float = 1.0, clock: float = 0.0) -> None:
        self.preset = preset
        self.factor = factor
        self.clock = self.started = clock  # simulated time the engine has reached
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.used_blocks = 0
        self.in_flight = 0
        self.current: tuple[dict[int, tuple[Request, int]], float] | None = None
        self.stats = Stats()

    @property
    def capacity_blocks(self) -> int:
        return int(self.preset.kv_tokens * self.factor) // BLOCK_TOKENS

    def set_factor(self, factor: float, at: float) -> None:
        self.factor = factor
        self.stats.capacity_changes.append({"at_sim_s": round(at, 3), "factor": factor})

    def add(self, req: Request) -> None:
        self.waiting.append(req)
        self.in_flight += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self.in_flight)

    def abort(self, req: Request) -> None:
        req.aborted = True
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        else:
            return
        self._free(req)
        self.in_flight -= 1
        self.stats.requests_aborted += 1

    def _free(self, req: Request) -> None:
        self.used_blocks -= req.blocks
        req.blocks = 0

    def _blocks_for(self, req: Request, n: int) -> int:
        if self.preset.slot_tokens:  # a slot's cache is its own from admission: never short
            return 0
        return math.ceil((req.computed + n) / BLOCK_TOKENS) - req.blocks

    def _preempt(self, victim: Request) -> None:
        self._free(victim)
        self.stats.recomputed_tokens += victim.computed
        victim.computed = 0
        victim.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(victim)

    def _plan(self) -> dict[int, tuple[Request, int]] | None:
        """One step's schedule at self.clock (vLLM V1 `schedule`, FCFS): {id: (request,
        tokens)}; None when there is nothing to run."""
        p = self.preset
        budget = p.max_batched_tokens
        free = self.capacity_blocks - self.used_blocks
        plan: dict[int, tuple[Request, int]] = {}
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(max(req.to_compute - req.computed, 1), budget)
            need = self._blocks_for(req, n)
            while need > free:
                # the newest: after req in admission order (not yet scheduled), or req itself
                victim = self.running.pop()
                preempted = True
                free += victim.blocks
                self._preempt(victim)
                if victim is req:
                    break
            if req not in self.running:
                break
            req.blocks += need
            self.used_blocks += need
            free -= need
            plan[id(req)] = (req, n)
            budget -= n
            i += 1
        while (not preempted and self.waiting and budget > 0
               and len(self.running) < p.max_num_seqs and self.waiting[0].arrival <= self.clock):
            req = self.waiting[0]
            n = min(req.to_compute - req.computed, budget)
            need = self._blocks_for(req, n)
            if need > free:
                break
            self.waiting.popleft()
            self.running.append(req)
            if req.first_scheduled is None:
                req.first_scheduled = self.clock
                self.stats.admitted += 1
                wait = self.clock - req.arrival
                self.stats.queue_wait_total += wait
                self.stats.queue_wait_max = max(self.stats.queue_wait_max, wait)
            req.blocks += need
            self.used_blocks += need
            free -= need
            plan[id(req)] = (req, n)
            budget -= n
        return plan or None

    def _step_seconds(self, plan: dict[int, tuple[Request, int]]) -> float:
        p = self.preset
        decodes = prefill = cached = 0
        for req, n in plan.values():
            if req.computed + n >= req.to_compute:  # the step writes this request a token
                decodes += 1
            if req.to_compute - req.computed > 1:   # a prompt (or a recompute) chunk
                prefill += n
            cached += req.computed + n
        seconds = (p.step_base_s + p.step_per_seq_s * decodes + p.kv_read_s_per_token * cached
                   + prefill / p.prefill_tokens_per_s)
        return seconds / self.factor  # a second tenant takes the rest of the compute

    def advance(self, until: float) -> None:
        """Run the engine up to `until` (simulated seconds): a step is planned when it starts
        (as the real scheduler does) and its tokens land when it ends."""
        while True:
            if self.current is None:
                plan = self._plan() if (self.running or self.waiting) else None
                if plan is None:
                    later = [r.arrival for r in self.waiting if r.arrival > self.clock]
                    if not later or min(later) > until:
                        self.clock = max(self.clock, until)
                        return
                    self.clock = min(later)
                    continue
                self.current = (plan, self.clock + self._step_seconds(plan))
            plan, end = self.current
            if end > until:
                return
            self.stats.busy_seconds += end - self.clock
            self.stats.steps += 1
            self.stats.max_running = max(self.stats.max_running, len(self.running))
            self.clock, self.current = end, None
            for req, n in plan.values():
                if req.aborted:
                    continue
                req.computed += n
                if req.computed >= req.to_compute:
                    req.generated += 1
                    if req.generated >= req.target:
                        self._finish(req)

    def _finish(self, req: Request) -> None:
        self.running.remove(req)
        self._free(req)
        self.in_flight -= 1
        self.stats.requests_done += 1
        self.stats.prompt_tokens += req.prompt
        self.stats.completion_tokens += req.generated
        if not req.done.done():
            req.done.set_result(self.clock)


def _content(user: str, tokens: int, cut: bool) -> str:
    """A Think model's answer of about `tokens` tokens: reasoning, then the extraction JSON; cut
    at `tokens` when max_tokens stopped it (the JSON then never closes)."""
    answer = json.dumps(extraction_for(user.split("---", 1)[-1]))
    chars = tokens * CHARS_PER_TOKEN
    if cut:
        pad = max(0, chars - len("<think>"))
        return ("<think>" + "reasoning " * (pad // 10 + 1))[:chars]
    pad = max(0, chars - len(answer) - len("<think></think>"))
    return "<think>" + ("reasoning " * (pad // 10 + 1))[:pad] + "</think>" + answer


class Simulator:
    """The engine behind an asyncio HTTP/1.1 server (keep-alive, Content-Length bodies: what
    httpx and the OpenAI clients send)."""

    def __init__(self, preset: Preset, speed: float) -> None:
        self.preset, self.speed = preset, speed
        self.engine = Engine(preset)
        self._t0 = time.monotonic()
        self._wake = asyncio.Event()

    def now(self) -> float:
        return (time.monotonic() - self._t0) * self.speed

    async def run_engine(self) -> None:
        while True:
            self.engine.advance(self.now())
            self._wake.clear()
            current = self.engine.current
            timeout = None if current is None and not self.engine.waiting else max(
                0.002, ((current[1] if current else self.engine.clock) - self.now()) / self.speed)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                method, path = line.decode("latin-1").split(" ")[:2]
                headers = {}
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                answer = await self.route(method, path, body, reader)
                if answer is None:  # the client went away mid-request
                    break
                status, payload = answer
                data = json.dumps(payload).encode()
                writer.write(f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
                             f"Content-Type: application/json\r\nContent-Length: {len(data)}"
                             "\r\n\r\n".encode() + data)
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def route(self, method: str, path: str, body: bytes,
                    reader: asyncio.StreamReader) -> tuple[int, Any] | None:
        path = path.split("?")[0]
        if method == "GET" and path == "/health":
            return 200, {"status": "ok"}
        if method == "GET" and path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.preset.model, "object": "model",
                                                     "max_model_len": self.preset.max_model_len}]}
        if method == "GET" and path == "/sim/stats":
            return 200, self.stats()
        if method == "POST" and path == "/sim/capacity":
            self.engine.advance(self.now())
            self.engine.set_factor(float(json.loads(body)["factor"]), self.engine.clock)
            self._wake.set()
            return 200, self.stats()
        if method == "POST" and path == "/sim/reset":
            if self.engine.in_flight:
                return 409, {"message": f"{self.engine.in_flight} requests in flight"}
            self.engine = Engine(self.preset, clock=self.now())
            return 200, self.stats()
        if method == "POST" and path == "/v1/chat/completions":
            return await self.chat(json.loads(body), reader)
        return 404, {"object": "error", "message": f"no route {method} {path}", "code": 404}

    async def chat(self, body: dict[str, Any],
                   reader: asyncio.StreamReader) -> tuple[int, Any] | None:
        p = self.preset
        messages = body["messages"]
        n_prompt = prompt_tokens(messages)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens")
                         or p.max_model_len - n_prompt)
        if p.slot_tokens and n_prompt >= p.slot_tokens:
            # llama-server's wording (tools/server/server-context.cpp: a prompt that fills
            # the slot's context is refused; max_tokens is only capped by it)
            return 400, {"error": {"code": 400, "type": "exceed_context_size_error",
                                   "n_prompt_tokens": n_prompt, "n_ctx": p.slot_tokens,
                                   "message": (f"request ({n_prompt} tokens) exceeds the "
                                               f"available context size ({p.slot_tokens} "
                                               "tokens), try increasing it")}}
        if not p.slot_tokens and n_prompt + max_tokens > p.max_model_len:
            # vLLM's wording (vllm/entrypoints/openai/serving_engine.py, _validate_input)
            return 400, {"object": "error", "type": "BadRequestError", "code": 400, "message": (
                f"This model's maximum context length is {p.max_model_len} tokens. However, you "
                f"requested {n_prompt + max_tokens} tokens ({n_prompt} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or "
                "completion.")}
        drawn = answer_tokens(messages, body.get("seed"), *p.output_tokens)
        target = min(drawn, max_tokens)
        req = Request(n_prompt, target, self.now(), asyncio.get_running_loop().create_future())
        self.engine.add(req)
        self._wake.set()
        gone = asyncio.ensure_future(reader.read(1))
        await asyncio.wait({req.done, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not req.done.done():
            self.engine.abort(req)
            self._wake.set()
            return None
        gone.cancel()  # and wait for it: the connection's next read must not race it
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        if gone.done() and not gone.cancelled() and gone.result():
            return None  # bytes before our answer: no pipelining here (httpx sends none)
        user = str(messages[-1].get("content") or "")
        return 200, {
            "id": f"sim-{id(req):x}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or p.model,
            "choices": [{"index": 0, "finish_reason": "length" if drawn > max_tokens else "stop",
                         "message": {"role": "assistant",
                                     "content": _content(user, target, drawn > max_tokens)}}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": target,
                      "total_tokens": n_prompt + target}}

    def stats(self) -> dict[str, Any]:
        e, s = self.engine, self.engine.stats
        return {**{k: (round(v, 3) if isinstance(v, float) else v) for k, v in vars(s).items()},
                "queue_wait_mean": round(s.queue_wait_total / s.admitted, 3) if s.admitted else 0.0,
                "sim_seconds": round(e.clock - e.started, 3), "speed": self.speed, "factor": e.factor,
                "in_flight": e.in_flight, "running": len(e.running), "waiting": len(e.waiting),
                "kv_capacity_tokens": e.capacity_blocks * BLOCK_TOKENS,
                "kv_used_tokens": e.used_blocks * BLOCK_TOKENS, "model": self.preset.model}


async def _serve(preset: Preset, speed: float, port: int,
                 ready: Any) -> None:
    sim = Simulator(preset, speed)
    server = await asyncio.start_server(sim.handle, "127.0.0.1", port, backlog=1024)
    ready(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    engine = asyncio.create_task(sim.run_engine())
    try:
        async with server:
            await server.serve_forever()
    finally:
        engine.cancel()


@contextlib.contextmanager
def simulator(preset: str = "l4-32b-q3", speed: float = 100.0) -> Iterator[str]:
    """The simulator in a process of its own (it does not share the client's GIL); yields its
    URL."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--preset", preset,
                             "--speed", str(speed)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url:
            raise RuntimeError(f"bench/endpoint_sim.py exited {proc.wait()} before serving")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def simulator_thread(preset: str = "l4-32b-q3", speed: float = 100.0) -> Iterator[str]:
    """The simulator on a thread of this process (for tests; it shares the GIL)."""
    got: list[str] = []
    ready = threading.Event()
    loop = asyncio.new_event_loop()

    def run() -> None:
        asyncio.set_event_loop(loop)
        task = loop.create_task(_serve(PRESETS[preset], speed, 0,
                                       lambda url: (got.append(url), ready.set())))
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield got[0]
    finally:
        for task in asyncio.all_tasks(loop):
            loop.call_soon_threadsafe(task.cancel)
        thread.join(10)


def _call(url: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if payload is None else json.dumps(payload).encode()
    with urllib.request.urlopen(urllib.request.Request(url + path, data=data), timeout=10) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def stats(url: str) -> dict[str, Any]:
    return _call(url, "/sim/stats")


def set_capacity(url: str, factor: float) -> dict[str, Any]:
    return _call(url, "/sim/capacity", {"factor": factor})


def reset(url: str) -> dict[str, Any]:
    return _call(url, "/sim/reset", {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="l4-32b-q3")
    ap.add_argument("--speed", type=float, default=100.0,
                    help="simulated seconds per real second")
    ap.add_argument("--port", type=int, default=0, help="0 = any free port")
    ap.add_argument("--kv-tokens", type=int, help="override the preset's KV cache capacity")
    args = ap.parse_args()
    preset = PRESETS[args.preset]
    if args.kv_tokens:
        preset = replace(preset, kv_tokens=args.kv_tokens)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(preset, args.speed, args.port, lambda url: print(url, flush=True)))


if __name__ == "__main__":
    main()
