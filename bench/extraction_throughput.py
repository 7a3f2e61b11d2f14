"""LLM client throughput against a fake endpoint with 200 ms latency: 32 slots vs serial.

Target: concurrent ≥ 20× serial and ≥ 90% of capacity (slots / latency = 160 requests/s).
    python bench/extraction_throughput.py
"""

from __future__ import annotations

import time

from _common import fake_endpoint, report

from tasks.extraction.calls import ExtractionConfig, extract_documents, run_sync
from tasks.extraction.documents import Document
from tasks.extraction.llm import LLMClient
from tasks.extraction.schema import json_schema

LATENCY, SLOTS = 0.2, 32


def docs(n: int) -> list[Document]:
    return [Document(f"transcripts/d{i}.md", "transcripts", f"/d{i}", str(i),
                     f"Ann Lee met Bob Stone about item {i}.", {"title": f"d{i}"})
            for i in range(n)]


def rate(url: str, slots: int, n: int) -> float:
    # adaptive=False: this measures the client's own overhead at a fixed number of slots
    # (bench/adaptive_concurrency.py measures how well the adaptive limit finds them)
    client = LLMClient(url, "fake", "vllm", max_concurrency=slots, timeout_seconds=30,
                       adaptive=False)
    t = time.perf_counter()
    out = run_sync(extract_documents(client, ExtractionConfig("bench", json_schema(12, 12), 1000), docs(n)))
    elapsed = time.perf_counter() - t
    errors = [o.error for o in out if o.error]
    assert not errors and client.usage.calls == n, (errors[:3], client.usage)
    return n / elapsed


def main() -> None:
    with fake_endpoint(LATENCY) as url:
        rate(url, SLOTS, 64)  # warm-up: connections, imports
        serial = rate(url, 1, 25)
        concurrent = rate(url, SLOTS, 1600)
    capacity = SLOTS / LATENCY
    report({"bench": "extraction_throughput", "latency_s": LATENCY, "slots": SLOTS,
            "serial_rps": round(serial, 2), "concurrent_rps": round(concurrent, 2),
            "speedup_vs_serial": round(concurrent / serial, 1),
            "share_of_capacity": round(concurrent / capacity, 3),
            "targets": {"speedup_vs_serial": ">= 20", "share_of_capacity": ">= 0.9"}})


if __name__ == "__main__":
    main()
