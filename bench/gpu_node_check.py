"""The llama-server checks only a GPU can answer, in one short run (a few minutes), for the day
a GPU is lent or the node first boots:

1. `GET /props`: the served model's chat template and its capabilities — does the template
   mark reasoning (`<think>` … `</think>` around `reasoning_content`)? Without it, a JSON
   grammar starts right after `<think>` and a Think model cannot reason
   ([inference] reasoning_budget_tokens needs it).
2. One extraction request as phase 1 sends it (the schema of the profile's bounds, the
   reasoning budget if the profile sets one): status, finish reason, tokens, seconds, whether
   reasoning_content came back and content parsed under the schema.
3. Throughput at 1, 4 and 8 concurrent ~2,000-token prompts (distinct from the first token,
   200 output tokens each, ignore_eos): wall time and aggregate output tokens/s, with
   llama-server's own counters from `/metrics` (needs --metrics, which the project passes),
   and the ratio of each to one stream.

Against a running server (the node's engine, `--url http://NODE:9080`), or one it starts here
from a GGUF with every layer on the GPU (`--model PATH`, llama-server from <venv>/bin: build it
with `python -m tasks.llama_build install --variant cuda`; `--slots`, `--context`, `--kv`).
Skips (exit 77) when there is neither a URL nor an NVIDIA GPU.

    python bench/gpu_node_check.py --url http://10.128.0.7:9080 [--profile gcp]
    python bench/gpu_node_check.py --model /opt/models/Olmo-3-32B-Think-Q3_K_M.gguf --slots 8
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from _common import ROOT, skip

sys.path.insert(0, str(ROOT))
from tasks.compute.inference_server import llama_server_args, server_ready  # noqa: E402
from tasks.extraction.llm import structured_output  # noqa: E402
from tasks.extraction.prompt import system_prompt  # noqa: E402
from tasks.extraction.schema import json_schema, parse_answer  # noqa: E402
from tasks.llama_cpp import CHECK_TEXT, require_server  # noqa: E402
from tasks.ontology import default_schema  # noqa: E402
from tasks.processes import ManagedServer, free_port  # noqa: E402

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


def throughput(url: str, model: str, n: int, first: int) -> dict[str, Any]:
    def one(i: int) -> int:
        prompt = f"Request {i}.\n" + CHECK_TEXT * 5  # ~2,000 tokens
        r = httpx.post(f"{url}/v1/chat/completions", timeout=1800, json={
            "model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 200, "temperature": 0.0, "ignore_eos": True})
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    before = metrics(url)
    t0 = time.monotonic()
    with ThreadPoolExecutor(n) as pool:
        tokens = sum(pool.map(one, range(first, first + n)))
    wall = time.monotonic() - t0
    after = metrics(url)
    return {"n": n, "wall_s": round(wall, 2), "output_tokens": tokens,
            "output_tok_per_s": round(tokens / wall, 2),
            "server_predicted_tokens": after.get("tokens_predicted_total", 0)
            - before.get("tokens_predicted_total", 0),
            "server_prompt_tokens": after.get("prompt_tokens_total", 0)
            - before.get("prompt_tokens_total", 0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--alias", default="olmo-3-32b-think")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--kv", default="q8_0")
    ap.add_argument("--reasoning-budget", type=int)
    args = ap.parse_args()
    if not args.url and not (args.model and shutil.which("nvidia-smi")):
        skip("gpu_node_check", "no --url, and no --model with an NVIDIA GPU here")
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    server = None
    url = args.url
    started_s = None
    if not url:
        port = free_port()
        extra = ["-ctk", args.kv, "-ctv", args.kv] + (["-fa", "on"] if args.kv != "f16" else [])
        argv = llama_server_args(require_server(), args.model, [args.alias], host="127.0.0.1",
                                 port=port, slots=args.slots, context_tokens=args.context,
                                 threads=2, gpu_layers="all", cache_ram_mib=2048, extra=extra)
        url = f"http://127.0.0.1:{port}"
        server = ManagedServer("gpu-check", tmp)
        t0 = time.monotonic()
        server.start(argv, port, marker=f"--port {port}", ready=lambda: server_ready(url),
                     timeout=1800)
        started_s = round(time.monotonic() - t0, 1)
    try:
        props = httpx.get(f"{url}/props", timeout=30).json()
        template = str(props.get("chat_template") or "")
        report: dict[str, Any] = {
            "bench": "gpu_node_check", "url": url, "load_s": started_s,
            "total_slots": props.get("total_slots"),
            "template_marks_reasoning": "<think>" in template and "reasoning_content" in template,
            "template_has_think": "<think>" in template,
            "chat_template_caps": props.get("chat_template_caps"),
            "n_ctx_per_slot": (props.get("default_generation_settings") or {}).get("n_ctx")}
        schema = json_schema(24, 24)
        budget = args.reasoning_budget
        body = {"model": args.alias, "max_tokens": 3072, "temperature": 0.0,
                "messages": [{"role": "system", "content": system_prompt(default_schema())},
                             {"role": "user", "content": TEXT}],
                **structured_output("llama.cpp", schema, budget is not None),
                **({"reasoning_budget_tokens": budget} if budget is not None else {})}
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
        rows, first = [], 0
        for n in (1, 4, 8):
            rows.append(throughput(url, args.alias, n, first))
            first += n
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        for row in rows:
            row["ratio_to_one_stream"] = round(row["output_tok_per_s"]
                                               / rows[0]["output_tok_per_s"], 3)
        report["throughput"] = rows
        print(json.dumps(report))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
