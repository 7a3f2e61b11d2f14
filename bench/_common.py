"""Shared helpers for the benchmarks: a fake endpoint in its own process, generated documents."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks import prefect_env  # noqa: E402

prefect_env.apply()
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


@contextlib.contextmanager
def fake_endpoint(latency: float) -> Iterator[str]:
    """The fake OpenAI server in a separate process, so it does not share our GIL."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.fake_openai", "--latency", str(latency)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(10)


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
    print(json.dumps(figures))


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
