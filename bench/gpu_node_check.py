"""The llama-server checks only a GPU can answer, in one short run (a few minutes), for the day
a GPU is lent or the node first boots:

1. `GET /props`: the served model's chat template and its capabilities — does the template
   mark reasoning (`<think>` … `</think>` around `reasoning_content`)? Without it, a JSON
   grammar starts right after `<think>` and a Think model cannot reason
   ([inference] reasoning_budget_tokens needs it).
2. One extraction request as phase 1 sends it (the schema of the profile's bounds, the
   reasoning budget if the profile sets one): status, finish reason, tokens, seconds, whether
   reasoning_content came back and content parsed under the schema.
3. Throughput of the night's own requests at 1, 4 and 8 concurrent: phase 1's client
   (tasks/extraction/llm.py LLMClient.extract, one attempt each, a fixed concurrency) sends
   distinct chunks of the example documents (examples/, chunked to the endpoint's chunk size by
   tasks/extraction/chunking.py, the longest first) with the night's system prompt, schema and
   structured output (the GBNF grammar, or the schema with a reasoning budget), its sampling and
   the server's `lora` list. Per level: wall seconds, requests, prompt and completion tokens, the
   completion tokens/s the client sees, the answers that parsed under the schema, and the
   deltas of llama-server's own `/metrics` (needs --metrics, which the project passes): tokens,
   and prompt and decode tokens/s per stream (tokens over the slots' summed seconds).
4. llama-server's host memory (VmRSS, VmHWM of /proc/PID/status) after loading and after each
   level, against the estimate of tasks/compute/host_memory.py — when it runs here: the server
   this script started, or `--pid` beside `--url` on the node itself. A remote server's is not
   readable from here, and the report says so.

Against a running server (the node's engine, `--url http://NODE:9080`), or one it starts here
from a GGUF with every layer on the GPU (`--model PATH`, llama-server from <venv>/bin: build it
with `python -m tasks.engine.llama_build install --variant cuda`; `--slots`, `--context`, `--kv`).
Skips (exit 77) when there is neither a URL nor an NVIDIA GPU.

    python bench/gpu_node_check.py --url http://10.128.0.7:9080 [--profile gcp] [--pid PID]
    python bench/gpu_node_check.py --model /opt/models/Olmo-3-32B-Think-Q3_K_M.gguf --slots 8
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _common import ROOT, skip

sys.path.insert(0, str(ROOT))
from blocks.inference import InferenceEndpoint  # noqa: E402
from blocks.node_serve import NodeServeSettings  # noqa: E402
from tasks.compute.inference_server import (  # noqa: E402
    Served,
    ServerSettings,
    llama_server_args,
    server_ready,
)
from tasks.engine.llama_cpp import require_server  # noqa: E402
from tasks.extraction.chunking import chunks  # noqa: E402
from tasks.extraction.documents import scan  # noqa: E402
from tasks.extraction.inputs import chunk_tokens, llm_client, response_schema  # noqa: E402
from tasks.extraction.llm import LLMClient  # noqa: E402
from tasks.extraction.prompt import system_prompt, user_prompt  # noqa: E402
from tasks.extraction.schema import Extraction, json_schema, parse_answer  # noqa: E402
from tasks.graph.ontology import GraphSchema, default_schema  # noqa: E402
from tasks.shared.processes import ManagedServer, free_port  # noqa: E402

EXAMPLES = ROOT / "examples"
TEXT = ("Ann Lee (Acme Corp) chaired the budget review with Bob Stone of the Paris office; they "
        "agreed that Cy Dunn leads the new building project from March.")


def metrics(url: str) -> dict[str, float]:
    """llama-server's Prometheus counters (llamacpp:*), name → value."""
    r = httpx.get(f"{url}/metrics", timeout=10)
    out = {}
    for line in r.text.splitlines():
        m = re.match(r"llamacpp:(\w+)\s+([0-9.eE+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def server_memory(pid: int | None) -> dict[str, Any]:
    """VmRSS and VmHWM (its peak) of the server's process, MiB, from /proc/PID/status."""
    if pid is None:
        return {"unreadable": "the server does not run on this machine (--url without --pid)"}
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as e:
        return {"unreadable": f"/proc/{pid}/status: {e.strerror}"}
    kb = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M))
    return {f"{k.lower()}_mib": round(int(v) / 1024, 1) for k, v in kb.items()}


def night_prompts(endpoint: InferenceEndpoint, ontology: GraphSchema, count: int,
                  examples: Path = EXAMPLES) -> list[tuple[str, str]]:
    """`count` distinct (system, user) prompts as phase 1 builds them (tasks/extraction/
    calls.py): the example documents chunked to the endpoint's chunk size, the longest chunks
    first (the night's full-size chunks)."""
    docs, _ = scan({s: examples / s for s in ("transcripts", "research")}, 2 * 2**20)
    system = system_prompt(ontology)
    users = []
    for doc in docs:
        parts = chunks(doc.text, chunk_tokens(endpoint, ontology), endpoint.chunk_overlap_tokens)
        users += [user_prompt(doc, c.text, c.index + 1, len(parts)) for c in parts]
    users.sort(key=len, reverse=True)
    if len(users) < count:
        raise ValueError(f"{count} distinct prompts wanted, the examples give {len(users)}")
    return [(system, u) for u in users[:count]]


def night_level(url: str, endpoint: InferenceEndpoint, ontology: GraphSchema,
                prompts: list[tuple[str, str]], concurrency: int) -> dict[str, Any]:
    """The prompts through phase 1's own client, `concurrency` at a time, one attempt each:
    what the client saw, and the deltas of the server's /metrics over the same time."""
    client = dataclasses.replace(llm_client(endpoint, url), max_concurrency=concurrency,
                                 adaptive=False, max_retries=0, pacing=None)
    schema = response_schema(endpoint, ontology)
    lora = httpx.get(f"{url}/lora-adapters", timeout=10)

    async def run() -> list[Any]:
        async with client:
            return await asyncio.gather(*(client.extract(system, user, schema, ontology=ontology)
                                          for system, user in prompts), return_exceptions=True)

    before = metrics(url)
    t0 = time.monotonic()
    answers = asyncio.run(run())
    wall = time.monotonic() - t0
    usage = client.usage
    # the server counts a request when its slot is released, a moment after the answer
    after = metrics(url)
    for _ in range(50):
        if after.get("tokens_predicted_total", 0) - before.get("tokens_predicted_total", 0) \
                >= usage.completion_tokens:
            break
        time.sleep(0.1)
        after = metrics(url)
    delta: dict[str, float] = {k: round(after[k] - before.get(k, 0.0), 3) for k in (
        "prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total",
        "tokens_predicted_total", "tokens_predicted_seconds_total") if k in after}
    errors: dict[str, int] = {}
    for a in answers:
        if not isinstance(a, Extraction):
            errors[type(a).__name__] = errors.get(type(a).__name__, 0) + 1

    def rate(tokens: str, seconds: str) -> float | None:
        return round(delta[tokens] / delta[seconds], 2) if delta.get(seconds) else None

    return {"concurrency": concurrency, "requests": len(prompts), "calls": usage.calls,
            "wall_s": round(wall, 2), "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "client_tok_per_s": round(usage.completion_tokens / wall, 2),
            "parsed": sum(isinstance(a, Extraction) for a in answers), "errors": errors,
            "unusable": usage.unusable_answers,
            "lora": [{"id": a["id"], "scale": a.get("scale")} for a in lora.json()]
            if lora.status_code == 200 else [],
            "metrics": delta,
            "server_prompt_tok_per_s": rate("prompt_tokens_total", "prompt_seconds_total"),
            "server_decode_tok_per_s_per_stream": rate("tokens_predicted_total",
                                                       "tokens_predicted_seconds_total")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--pid", type=int, help="the server's process id, when --url is this machine")
    ap.add_argument("--profile", help="the night's [inference] and ontology (default: OLMo 3 "
                    "Think's, from the flags below)")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--alias", default="olmo-3-32b-think")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=3072)
    ap.add_argument("--kv", choices=("f16", "q8_0"), default="q8_0")
    ap.add_argument("--reasoning-budget", type=int)
    ap.add_argument("--levels", default="1,4,8", help="concurrencies, e.g. 1,4,8")
    args = ap.parse_args()
    if not args.url and not (args.model and shutil.which("nvidia-smi")):
        skip("gpu_node_check", "no --url, and no --model with an NVIDIA GPU here")
    if args.profile:
        from tasks.profile import load_profile

        cfg = load_profile(args.profile)
        endpoint, ontology = cfg.inference, cfg.extraction.ontology()
    else:
        endpoint = InferenceEndpoint(model=args.alias, dialect="llama.cpp",
                                     context_tokens=args.context,
                                     max_output_tokens=args.max_tokens,
                                     max_concurrent_requests=args.slots,
                                     reasoning_budget_tokens=args.reasoning_budget)
        ontology = default_schema()
    node = NodeServeSettings(kv_cache_type=args.kv)  # the node's host-cache settings
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    server = None
    url = args.url
    pid = args.pid
    started_s = None
    if not url:
        port = free_port()
        extra = ["-ctk", args.kv, "-ctv", args.kv] + (["-fa", "on"] if args.kv != "f16" else [])
        argv = llama_server_args(require_server(), Served(args.model, endpoint.model),
                                 ServerSettings(slots=endpoint.max_concurrent_requests,
                                                context_tokens=endpoint.context_tokens,
                                                threads=2, gpu_layers="all",
                                                cache_ram_mib=node.cache_ram_mib,
                                                ctx_checkpoints=node.ctx_checkpoints,
                                                cache_idle_slots=node.cache_idle_slots,
                                                extra=extra),
                                 host="127.0.0.1", port=port)
        url = f"http://127.0.0.1:{port}"
        server = ManagedServer("gpu-check", tmp)
        t0 = time.monotonic()
        server.start(argv, port, marker=f"--port {port}", ready=lambda: server_ready(url),
                     timeout=1800)
        started_s = round(time.monotonic() - t0, 1)
        record = server.record()
        pid = record.pid if record else None
    try:
        from tasks.compute.host_memory import Host, host_fit
        from tasks.compute.kv_budget import ModelShape

        props = httpx.get(f"{url}/props", timeout=30).json()
        template = str(props.get("chat_template") or "")
        report: dict[str, Any] = {
            "bench": "gpu_node_check", "url": url, "load_s": started_s,
            "total_slots": props.get("total_slots"),
            "template_marks_reasoning": "<think>" in template and "reasoning_content" in template,
            "template_has_think": "<think>" in template,
            "chat_template_caps": props.get("chat_template_caps"),
            "n_ctx_per_slot": (props.get("default_generation_settings") or {}).get("n_ctx"),
            "server_memory_loaded": server_memory(pid),
            "host_memory_estimate": host_fit(
                endpoint.max_concurrent_requests, endpoint.context_tokens,
                ModelShape.of_node(node), node.kv_cache_type, Host.of_node(node)).text()}
        schema = json_schema(24, 24)
        budget = endpoint.reasoning_budget_tokens
        # the night's client's own request (raw here: reasoning_content is looked at)
        client = LLMClient(url, endpoint.model, dialect="llama.cpp", reasoning_budget=budget,
                           max_output_tokens=endpoint.max_output_tokens)
        body = {**client.request_body(system_prompt(default_schema()), TEXT, schema),
                "temperature": 0.0}
        t0 = time.monotonic()
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=1800)
        one: dict[str, Any] = {"status": r.status_code, "seconds": round(time.monotonic() - t0, 2)}
        if r.status_code == 200:
            choice = r.json()["choices"][0]
            msg = choice["message"]
            one.update(finish_reason=choice.get("finish_reason"), usage=r.json().get("usage"),
                       reasoning_chars=len(msg.get("reasoning_content") or ""))
            try:
                answer = parse_answer(json.loads(msg.get("content") or ""), schema)
                one.update(parsed=True, entities=len(answer.entities),
                           relationships=len(answer.relationships))
            except Exception as e:  # noqa: BLE001 - reported
                one.update(parsed=False, error=f"{type(e).__name__}: {e}"[:300])
        else:
            one["body"] = r.text[:500]
        report["extraction"] = one
        levels = [int(n) for n in args.levels.split(",")]
        prompts = night_prompts(endpoint, ontology, sum(levels))
        rows, first = [], 0
        for n in levels:  # distinct chunks throughout: no level reuses another's prompt
            rows.append(night_level(url, endpoint, ontology, prompts[first:first + n], n))
            rows[-1]["server_memory"] = server_memory(pid)
            first += n
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        for row in rows:
            row["ratio_to_one_stream"] = round(row["client_tok_per_s"]
                                               / max(rows[0]["client_tok_per_s"], 1e-9), 3)
        report["throughput"] = rows
        print(json.dumps(report))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
