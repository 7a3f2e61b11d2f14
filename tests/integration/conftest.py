"""The integration tier's fixtures: real FalkorDB, a real (ephemeral-harness) Prefect server,
the real models (SmolLM2-135M, a tiny OLMo 3, a tiny Llama), the weights source, and the SIGILL
stand-ins."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks.graph import falkordb_server, neo4j_local
from tasks.graph.falkordb_store import FalkorDBStore
from tasks.graph.neo4j_local import LocalNeo4j
from tasks.graph.store import GraphStore
from tasks.shared.files import locked
from tests.support.neo4j import NEO4J_SETTINGS, empty_neo4j
from tests.support.weights import BASE_GGUF, COMMIT, GGUF_NAME


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """Prefect's test harness, one server per test process, on a port from tasks.shared.processes'
    reservations: the harness's own pick (bind port 0 in 8000–8999, close, hand it on) gave two
    xdist workers one number, and the loser's health check was answered by the winner's server.
    Its database (prefect-test.db in a folder of its own) starts as a copy of a migrated one."""
    import tempfile
    from unittest import mock

    from prefect.testing import utilities

    from tasks.shared.processes import free_port
    from tests.support.prefect import seeded

    def folder() -> str:
        return str(seeded(Path(tempfile.mkdtemp()), "prefect-test.db"))

    with mock.patch.object(utilities, "_find_available_port", free_port), \
            mock.patch.object(utilities, "mkdtemp", folder), \
            utilities.prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def falkordb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    data = tmp_path_factory.mktemp("falkordb")
    rec, _ = falkordb_server.start(data)
    yield rec.port
    falkordb_server.stop(data)


@pytest.fixture(scope="session")
def neo4j_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNeo4j]:
    """Neo4j Community 5.26 (tasks/graph/neo4j_local.py), one per test process, with
    authentication on and a password made for it. Never skipped: `make test` resolves it, and
    a machine without Java fails here with the fix. Community has one database, so the tests
    of a process share `neo4j` and each starts by emptying it (empty_neo4j)."""
    server = neo4j_local.start(secrets.token_urlsafe(16), tmp_path_factory.mktemp("neo4j"),
                               NEO4J_SETTINGS, lean=True)
    yield server
    server.stop(timeout=0)  # killed: a clean shutdown takes ~10 s and its data is thrown away


@pytest.fixture(params=["falkordb", "neo4j"])
def store(request: pytest.FixtureRequest) -> Iterator[GraphStore]:
    """The same graph test on both stores: FalkorDB (the embedded default) and Neo4j (the
    production store), each with batches of 7 rows."""
    if request.param == "neo4j":
        s: GraphStore = empty_neo4j(request.getfixturevalue("neo4j_server"))
        yield s
        s.close()
        return
    falkordb = request.getfixturevalue("falkordb")
    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:60]
    f = FalkorDBStore("127.0.0.1", falkordb, name, batch_size=7)
    f.ensure_schema()
    yield f
    try:
        f._graph.delete()
    except Exception:  # noqa: BLE001 - graph never written
        pass
    f.close()


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder every xdist worker of this session shares (the parent of their basetemps; the
    basetemp itself without xdist)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def base_cache(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """SmolLM2-135M dequantized once per session (HF folder + F32 GGUF), shared by tests and by
    the xdist workers (the cache publishes each entry atomically; the lock spares the second
    worker the same 30 s of work)."""
    cache = shared_dir(tmp_path_factory, "base-cache")
    from tasks.engine.llama_cpp import default_model_path
    from tasks.training.base_model import f32_gguf, hf_from_gguf

    gguf_path = default_model_path()
    with locked(cache.parent / f".{cache.name}.lock"):  # beside it: tests list the cache
        t = time.monotonic()
        hf = hf_from_gguf(gguf_path, cache)
        cold = time.monotonic() - t
        f32 = f32_gguf(gguf_path, cache)
    return {"gguf": gguf_path, "cache": cache, "hf": hf, "cold_s": cold, "f32": f32}


@pytest.fixture(scope="session")
def olmo3_tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny random OLMo 3 (tests/support/olmo3_tiny.py) as an HF folder, and its F32 base GGUF
    written by llama.cpp's own converter: {"hf", "gguf", "config", "build_s", "export_s"}. Made
    once per session, as base_cache is: the xdist workers share it (read only) and the lock
    spares the second worker the same work."""
    from tasks.engine.llama_cpp import default_model_path
    from tasks.training.convert import export_base
    from tests.support import olmo3_tiny as tiny

    root = shared_dir(tmp_path_factory, "olmo3-tiny")
    hf, gguf, made = root / "hf", root / "olmo3-tiny.F32.gguf", root / "made.json"
    with locked(root.parent / f".{root.name}.lock"):
        if not made.is_file():  # written last: the folder is whole
            t = time.monotonic()
            config = tiny.build(hf, default_model_path())["config"]
            build_s = round(time.monotonic() - t, 1)
            t = time.monotonic()
            export_base(hf, gguf, "f32")
            made.write_text(json.dumps({"config": config, "build_s": build_s,
                                        "export_s": round(time.monotonic() - t, 1)}))
    return {**json.loads(made.read_text()), "hf": hf, "gguf": gguf}


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


# The same failure for llama-server, on its first prompt only (it loads the same shared ggml
# since issue 36, but evaluates a warm-up graph at start, which the ggml stand-in would kill):
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


@pytest.fixture(scope="session")
def tiny_base(base_cache: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template, saved as a folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(base_cache["hf"])
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        initializer_range=0.2))  # wide enough that a fixed lm_head can express a confident answer
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def source(olmo3_tiny: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A source folder as the operator lays it out: the GGUF, the tokenizer folder, and the base
    downloaded with `hf download --local-dir` (its .cache metadata names the hub commit)."""
    from huggingface_hub._local_folder import write_download_metadata

    src = tmp_path_factory.mktemp("weights-source")
    shutil.copy(olmo3_tiny["gguf"], src / GGUF_NAME)
    shutil.copy(olmo3_tiny["gguf"], src / BASE_GGUF)  # the base's GGUF (the recipe's base_gguf)
    shutil.copytree(olmo3_tiny["hf"], src / "Olmo-3-7B-Think")
    (src / "Olmo-3-32B-Think").mkdir()
    for p in Path(olmo3_tiny["hf"]).iterdir():
        if p.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(p, src / "Olmo-3-32B-Think" / p.name)
    write_download_metadata(src / "Olmo-3-7B-Think", "config.json", COMMIT, "etag1")
    return src
