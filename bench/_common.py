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

from tasks import prefect_env  # noqa: E402

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


@contextlib.contextmanager
def prefect_server(home: Path, **settings: str) -> Iterator[dict[str, str]]:
    """A real `prefect server start` on a free port with its own PREFECT_HOME; yields the
    environment for subprocesses (CLI, workers, flows) to talk to it."""
    import httpx

    from tasks.processes import free_port

    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PWD": str(ROOT),
           "PREFECT_LOGGING_LEVEL": "INFO", "PYTHONPATH": str(ROOT), **settings}
    env.pop("PREFECT_API_KEY", None)
    server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(240):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                raise RuntimeError(f"prefect server start exited with {server.returncode}")
            time.sleep(0.5)
        else:
            raise RuntimeError("the Prefect server did not become healthy in 120 s")
        yield env
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


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
