"""Shared helpers for the benchmarks: the fake endpoint in its own process, a real Prefect
server, generated documents, the one-JSON-line report and the skip convention.

bench/ imports nothing from tests/: what both need lives in the project (tasks/, blocks/) or,
for the fake endpoint, in bench/_fakes.py (see its docstring).

A bench that cannot run on this machine (no GPU, a missing library) calls `skip(name, why)`:
it prints `{"bench": name, "skipped": why}` and exits SKIP (77, the exit code automake and
meson use for "skipped"). bench/run_all.py runs every bench and tells skips from failures.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.runtime import prefect_env  # noqa: E402

prefect_env.apply()
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

SKIP = 77
PREFECT = str(Path(sys.executable).parent / "prefect")


def skip(bench: str, why: str) -> NoReturn:
    """Say why this bench cannot run here and exit with SKIP."""
    print(json.dumps({"bench": bench, "skipped": why}), flush=True)
    sys.exit(SKIP)


@contextlib.contextmanager
def fake_endpoint(latency: float) -> Iterator[str]:
    """The fake OpenAI server (bench/_fakes.py) in a separate process, so it does not share
    our GIL; yields its URL."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "_fakes.py"),
                             "--latency", str(latency)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(10)


prefect_server = prefect_env.api_server  # the tests' server too


def write_documents(root: Path, n: int) -> None:
    """n small transcripts, each naming a few people (some shared across documents)."""
    t = root / "transcripts"
    t.mkdir(parents=True, exist_ok=True)
    for s in ("research", "contacts"):
        (root / s).mkdir(exist_ok=True)
    first = ["Ann", "Bob", "Cy", "Dee", "Eve", "Finn", "Gus", "Hal"]
    for i in range(n):
        people = [f"{first[(i + k) % 8]} Person{(i * 7 + k) % 300:03d}".replace("Person", "Pers")
                  for k in range(3)]
        names = [p.split()[0] + " " + p.split()[1].capitalize() for p in people]
        (t / f"doc{i:05d}.md").write_text(
            f"---\nmeeting_id: m{i}\n---\n# Meeting {i}\n\n**Chair:** {' and '.join(names)} "
            "discussed the quarterly plan.\n")


@contextlib.contextmanager
def phase1_setup(n_documents: int, latency: float) -> Iterator[tuple[Path, int, str]]:
    """n generated documents, an embedded FalkorDB and the fake endpoint: (tmp, port, url)."""
    import tempfile

    from tasks.graph import falkordb_server

    tmp = Path(tempfile.mkdtemp())
    write_documents(tmp / "docs", n_documents)
    rec, _ = falkordb_server.start(tmp / "graph")
    try:
        with fake_endpoint(latency) as url:
            yield tmp, rec.port, url
    finally:
        falkordb_server.stop(tmp / "graph")


def report(figures: dict) -> None:
    """The bench's figures as one JSON line (the last line it prints)."""
    print(json.dumps(figures), flush=True)


def profile(tmp: Path, url: str, falkordb_port: int, graph: str, slots: int,
            batch_documents: int) -> Path:
    p = tmp / f"{graph}.toml"
    p.write_text(f"""
state_dir = "{tmp / 'state'}"
[inference]
base_url = "{url}"
dialect = "vllm"
model = "fake"
max_concurrent_requests = {slots}
request_timeout_seconds = 60
[graph]
type = "falkordb"
host = "127.0.0.1"
port = {falkordb_port}
graph_name = "{graph}"
[sources]
transcripts = "{tmp / 'docs' / 'transcripts'}"
[extraction]
batch_documents = {batch_documents}
""")
    return p


# The endpoint simulator's benches (adaptive_concurrency, scale_out, deadline) send transcripts
# of a real chunk's size: ~5,400 characters ≈ 1,350 tokens, ~1,750 with the system prompt.
_SIM_WORDS = "the plan budget quarter review hiring roadmap vendor contract launch risk".split()


def sim_documents(n: int, tag: str, words: int = 900) -> list:
    """n distinct transcripts of `words` words each naming two people (distinct text, so the
    simulator draws each answer's length afresh)."""
    from tasks.extraction.documents import Document

    out = []
    for i in range(n):
        body = " ".join(_SIM_WORDS[(i * 7 + k) % len(_SIM_WORDS)] for k in range(words))
        out.append(Document(f"transcripts/{tag}{i}.md", "transcripts", f"/{tag}{i}", f"{tag}{i}",
                            f"Ann Lee met Bob Stone. {body} ({tag} {i})", {"title": f"{tag}{i}"}))
    return out


def timed_extraction(client, docs: list, on_done=None) -> dict:
    """Extract `docs` through `client` (one request a document): the seconds from the start at
    which each document ended, the errors, and the wall time."""
    from tasks.extraction.calls import ExtractionConfig, extract_documents, run_sync
    from tasks.extraction.schema import json_schema

    t0 = time.perf_counter()
    done_at: list[float] = []

    def record(outcome) -> None:
        done_at.append(time.perf_counter() - t0)
        if on_done:
            on_done(outcome, len(done_at))

    config = ExtractionConfig("bench", json_schema(12, 12), 4000)
    out = run_sync(extract_documents(client, config, docs, record))
    return {"seconds": time.perf_counter() - t0, "done_at": sorted(done_at),
            "errors": [o.error for o in out if o.error],
            "deferred": sum(1 for o in out if getattr(o, "deferred", False))}


def goodput(done_at: list[float], share: float = 0.9, since: float = 0.0,
            first: int = 0) -> float:
    """Documents a second up to the moment `share` of them had ended (the drain at the end,
    where any client's concurrency must fall, left out alike for every run); `since`/`first`:
    counted from that moment and that many documents already done."""
    k = max(first + 1, int(len(done_at) * share))
    return (k - first) / (done_at[k - 1] - since)
