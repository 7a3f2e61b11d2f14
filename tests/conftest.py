"""Shared fixtures: real FalkorDB, a real (ephemeral-harness) Prefect server, the fake and the
real OpenAI-compatible servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tasks.runtime import prefect_env

prefect_env.apply()
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# An orchestrator exports SLM_NIGHTLY_PROFILE=gcp (docs/operator-gcp.md): the tests that call
# the CLI without --profile expect the shipped defaults.
os.environ.pop("SLM_NIGHTLY_PROFILE", None)

from tasks.graph import falkordb_server  # noqa: E402
from tasks.graph.backends import FalkorDBStore  # noqa: E402
from tests.fake_openai import FakeOpenAI  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).parent / "prefect")


def prefect_cli(args: list[str], env: dict[str, str], cwd: Path = ROOT,
                timeout: float = 240) -> str:
    """`prefect ARGS` of this environment; its stdout, or the test fails with its output."""
    proc = subprocess.run([PREFECT, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc.stdout


@contextmanager
def prefect_server(home: Path, port: int | None = None, **settings: str
                   ) -> Iterator[dict[str, str]]:
    """A real `prefect server start` on a free port (or `port`) with its own PREFECT_HOME;
    yields the environment for subprocesses (CLI, workers, flows) to talk to it. `settings`:
    extra PREFECT_* variables for the server and its clients."""
    import httpx

    from tasks.processes import free_port

    port = port or free_port()
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
                pytest.fail(f"prefect server start exited with {server.returncode}")
            time.sleep(0.5)
        else:
            pytest.fail("Prefect server did not become healthy in 120 s")
        yield env
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def falkordb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    data = tmp_path_factory.mktemp("falkordb")
    rec, _ = falkordb_server.start(data)
    yield rec.port
    falkordb_server.stop(data)


@pytest.fixture
def store(falkordb: int, request: pytest.FixtureRequest) -> Iterator[FalkorDBStore]:
    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:60]
    s = FalkorDBStore("127.0.0.1", falkordb, name, batch_size=7)
    s.ensure_schema()
    yield s
    try:
        s._graph.delete()
    except Exception:  # noqa: BLE001 - graph never written
        pass
    s.close()


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(slow_seconds=2.0) as f:
        yield f


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a TOML basic string (Paths included)


def toml_profile(path: Path, **keys: Any) -> Path:
    """Write a test profile: `toml_profile(tmp / "p.toml", state_dir=tmp / "state",
    compute={"type": "local"}, inference={"model": "fake", "max_retries": 1})`. A dict is a
    [table] (a dict inside it a [table.sub]); anything else a top-level key; None is left out.
    Strings and Paths are quoted and escaped, so no test hand-writes TOML."""
    lines: list[str] = []

    def table(name: str, body: dict[str, Any]) -> None:
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in body.items()
                     if v is not None and not isinstance(v, dict))
        for k, v in body.items():
            if isinstance(v, dict):
                table(f"{name}.{k}", v)

    lines.extend(f"{k} = {_toml_value(v)}" for k, v in keys.items()
                 if v is not None and not isinstance(v, dict))
    for k, v in keys.items():
        if isinstance(v, dict):
            table(k, v)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_profile(tmp: Path, *, base_url: str | None, falkordb_port: int, graph: str,
                  sources: Path, extra_inference: str = "", max_failed_share: float = 1.0,
                  request_timeout: float = 1.0,
                  batch_documents: int = 3) -> Path:
    """A profile pointing at test servers; sources has transcripts/research/contacts dirs."""
    for s in ("transcripts", "research", "contacts"):
        (sources / s).mkdir(parents=True, exist_ok=True)
    url = f'base_url = "{base_url}"' if base_url else ""
    text = textwrap.dedent(f"""
        state_dir = "{tmp / 'state'}"
        [compute]
        type = "local"
        [inference]
        {url}
        dialect = "vllm"
        model = "fake"
        max_concurrent_requests = 4
        request_timeout_seconds = {request_timeout}
        readiness_timeout_seconds = 10
        max_retries = 3
        retry_base_seconds = 0.01
        context_tokens = 2048
        max_output_tokens = 256
        {extra_inference}
        [graph]
        type = "falkordb"
        host = "127.0.0.1"
        port = {falkordb_port}
        graph_name = "{graph}"
        batch_size = 5
        [sources]
        transcripts = "{sources / 'transcripts'}"
        research = "{sources / 'research'}"
        contacts = "{sources / 'contacts'}"
        [extraction]
        max_failed_share = {max_failed_share}
        batch_documents = {batch_documents}
    """)
    path = tmp / "profile.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def base_cache(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """SmolLM2-135M dequantized once per session (HF folder + F32 GGUF), shared by tests."""
    cache = tmp_path_factory.mktemp("base-cache")
    from tasks.compute.inference_server import default_model_path
    from tasks.training.base_model import f32_gguf, hf_from_gguf

    gguf_path = default_model_path()
    t = time.monotonic()
    hf = hf_from_gguf(gguf_path, cache)
    cold = time.monotonic() - t
    return {"gguf": gguf_path, "cache": cache, "hf": hf, "cold_s": cold,
            "f32": f32_gguf(gguf_path, cache)}


@pytest.fixture(scope="session")
def olmo3_tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny random OLMo 3 (tests/olmo3_tiny.py) as an HF folder, and its F32 base GGUF
    written by llama.cpp's own converter: {"hf", "gguf", "config", "build_s", "export_s"}."""
    from tasks.compute.inference_server import default_model_path
    from tasks.training.convert import export_base
    from tests import olmo3_tiny as tiny

    root = tmp_path_factory.mktemp("olmo3-tiny")
    t = time.monotonic()
    built = tiny.build(root / "hf", default_model_path())
    built["build_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    built["gguf"] = export_base(built["hf"], root / "olmo3-tiny.F32.gguf", "f32")
    built["export_s"] = round(time.monotonic() - t, 1)
    return built


# A stand-in for one function of ggml (ggml/include/ggml-backend.h of the llama.cpp vendored in
# llama-cpp-python 0.3.36): llama_decode hands each graph to
# ggml_backend_sched_graph_compute_async, which libllama.so imports from libggml-base.so.
# Preloaded (LD_PRELOAD), the stand-in takes that call and executes ud2, an illegal
# instruction: the kernel sends SIGILL, as it did for the -march=native build's AMX
# `tileloadd`. Loading a model and listing it still work; the first evaluation dies.
SIGILL_STUB = r"""
int ggml_backend_sched_graph_compute_async(void *sched, void *graph) {
    (void)sched; (void)graph;
    __asm__ volatile("ud2");
    return 0;
}
"""


# The same failure for llama-server, which links ggml statically (nothing of it to interpose):
# it reads each request with libc's recv() (vendor/cpp-httplib/httplib.cpp read_socket), so
# the stand-in takes recv and executes ud2 once a chat completion arrives. Loading, warm-up,
# /health and /v1/models work; the first prompt kills the server with SIGILL. Every other
# process that inherits LD_PRELOAD gets the real recv (dlsym RTLD_NEXT) for its own traffic.
SERVER_SIGILL_STUB = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
ssize_t recv(int fd, void *buf, size_t n, int flags) {
    static ssize_t (*real)(int, void *, size_t, int);
    if (!real) real = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
    ssize_t got = real(fd, buf, n, flags);
    if (got > 0 && memmem(buf, (size_t)got, "POST /v1/chat/completions", 25))
        __asm__ volatile("ud2");
    return got;
}
"""


@pytest.fixture(scope="session")
def server_sigill_preload(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The llama-server stand-in, compiled: a path for LD_PRELOAD."""
    out = tmp_path_factory.mktemp("server-sigill")
    (out / "stub.c").write_text(SERVER_SIGILL_STUB)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(out / "libsigill-recv.so"),
                    str(out / "stub.c"), "-ldl"], check=True)
    return str(out / "libsigill-recv.so")


@pytest.fixture(scope="session")
def sigill_preload(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The stand-in, compiled: a path for LD_PRELOAD."""
    out = tmp_path_factory.mktemp("sigill")
    (out / "stub.c").write_text(SIGILL_STUB)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(out / "libsigill.so"),
                    str(out / "stub.c")], check=True)
    return str(out / "libsigill.so")
