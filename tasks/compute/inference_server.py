"""The local inference server (llama.cpp's OpenAI-compatible server) and readiness polling."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from blocks.inference import server_root
from tasks.errors import ServerError
from tasks.files import write_atomic
from tasks.llama_build import default_model_path as default_model_path  # its public home here
from tasks.processes import ManagedServer, free_port, tail

SERVER_NAME = "inference"
# faulthandler: a server killed by a fatal signal (SIGILL, SIGSEGV) writes "Fatal Python error:
# Illegal instruction" and its stack to its log before it dies, so the log says why.
SERVER_PYTHON = (sys.executable, "-X", "faulthandler")


def models_ready(base_url: str, api_key: str | None = None, timeout: float = 5.0) -> bool:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{server_root(base_url)}/v1/models", headers=headers, timeout=timeout)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and bool(r.json().get("data"))


def probe(base_url: str, api_key: str | None = None, timeout: float = 5.0
          ) -> tuple[str, list[str]]:
    """Where a vLLM-style server is on its way up: ("down" | "unhealthy" | "no models" |
    "ready", the model ids it lists). /health first (cheap; 200 while the engine lives),
    then /v1/models."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base_url = server_root(base_url)  # http://host:9080/v1 (the OpenAI SDK's form) too
    try:
        h = httpx.get(f"{base_url}/health", headers=headers, timeout=timeout)
        if h.status_code >= 500:
            return f"unhealthy (GET /health: HTTP {h.status_code})", []
        r = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=timeout)
    except httpx.HTTPError:
        return "down (no answer on the port yet: booting or loading weights)", []
    if r.status_code != 200:
        return f"not ready (GET /v1/models: HTTP {r.status_code})", []
    ids = [m.get("id", "") for m in r.json().get("data") or []]
    return ("ready" if ids else "no models listed yet"), ids


def wait_ready(base_url: str, timeout: float, api_key: str | None = None,
               poll: float = 1.0, max_poll: float = 30.0) -> float:
    """Poll /v1/models until it lists a model; return the seconds waited."""
    start = time.monotonic()
    while True:
        if models_ready(base_url, api_key):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise ServerError(f"inference endpoint {base_url} not ready after {timeout:.0f} s "
                              "(GET /v1/models) — check the server log, or raise the inference "
                              "block's readiness_timeout_seconds")
        time.sleep(poll)
        poll = min(poll * 1.5, max_poll)


def check_adapter_loads(model_path: Path, adapter: Path, timeout: float = 120.0) -> None:
    """llama.cpp ignores an adapter it cannot load (and the first completion may then crash the
    server): load it once in a child process and check it really attached."""
    code = ("import sys, llama_cpp\n"
            "m = llama_cpp.Llama(model_path=sys.argv[1], lora_path=sys.argv[2], n_ctx=64, "
            "verbose=False)\n"
            "sys.exit(0 if m._lora_adapter else 3)\n")
    try:
        r = subprocess.run([sys.executable, "-c", code, str(model_path), str(adapter)],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ServerError(f"adapter {adapter}: loading it took over {timeout:.0f} s") from e
    if r.returncode != 0:
        raise ServerError(f"adapter {adapter} does not load onto {model_path.name} (exit "
                          f"{r.returncode}): {(r.stderr or '').strip()[-400:]} — roll it back "
                          "(slm-nightly adapters rollback BUCKET) or re-export it")


def models_config(model_path: Path, models: dict[str, Path | None], n_ctx: int,
                  n_threads: int, port: int) -> dict[str, Any]:
    """llama-cpp-python's server config file (llama_cpp/server/settings.py ConfigFileSettings):
    the base under each alias in `models`, with that alias's GGUF LoRA adapter (None: none).
    The first alias is the default model, loaded at start; asking for another swaps it in."""
    return {"host": "127.0.0.1", "port": port, "models": [
        {"model": str(model_path), "model_alias": alias, "n_ctx": n_ctx, "n_threads": n_threads,
         # Defaults to True: computes logits for every prompt token (3.5x slower, 4x memory).
         "logits_all": False, **({"lora_path": str(lora)} if lora else {})}
        for alias, lora in models.items()]}


def start_llama_server(state_dir: Path, model_path: Path, alias: str, n_ctx: int,
                       n_threads: int, readiness_timeout: float,
                       adapter: Path | None = None, names: tuple[str, ...] = ()) -> str:
    """Start `python -m llama_cpp.server` on a free loopback port; return its base URL.
    With `adapter`, the GGUF LoRA adapter is checked to load, then served on the base — under
    `alias` and under each of `names` (the bucket's name it is published as), through the
    server's config file."""
    server = ManagedServer(SERVER_NAME, state_dir)
    server.stop()  # a leftover from a crashed run would hold the CPU
    if adapter is not None:
        check_adapter_loads(model_path, adapter)
    port = free_port()
    argv = [
        *SERVER_PYTHON, "-m", "llama_cpp.server",
        "--model", str(model_path),
        "--model_alias", alias,
        "--n_ctx", str(n_ctx),
        "--n_threads", str(n_threads),
        # Defaults to True: computes logits for every prompt token (3.5x slower, 4x memory).
        "--logits_all", "False",
        "--host", "127.0.0.1",
        "--port", str(port),
    ]
    if adapter is not None:
        argv += ["--lora_path", str(adapter)]
    marker = f"--port {port}"
    if adapter is not None and names:  # several aliases: only the config file can say so
        for stale in state_dir.glob(f"{SERVER_NAME}-*.json"):  # of servers stopped above
            stale.unlink(missing_ok=True)
        config = state_dir / f"{SERVER_NAME}-{port}.json"
        write_atomic(config, json.dumps(models_config(
            model_path, {alias: adapter, **dict.fromkeys(names, adapter)}, n_ctx, n_threads,
            port), indent=1))
        argv = [*SERVER_PYTHON, "-m", "llama_cpp.server", "--config_file", str(config)]
        marker = str(config)
    base_url = f"http://127.0.0.1:{port}"
    log = state_dir / f"{SERVER_NAME}.log"
    offset = log.stat().st_size if log.exists() else 0
    server.start(argv, port, marker=marker, ready=lambda: models_ready(base_url),
                 timeout=readiness_timeout)
    if adapter is not None:  # the server's own log says whether the adapter attached
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
        loaded = re.search(r"loaded (\d+) tensors from lora file", text)
        if not loaded or int(loaded.group(1)) == 0:
            server.stop()
            raise ServerError(f"inference server started without adapter {adapter} (no "
                              f"'loaded N tensors from lora file' in {log}) — roll the adapter "
                              "back (slm-nightly adapters rollback BUCKET)")
    return base_url


def server_exit(state_dir: Path, settle_seconds: float = 1.0) -> str | None:
    """Why the local inference server is gone, when it died under the run (it was started and
    not stopped): "the inference server exited with signal 4 (SIGILL), see its log …" with the
    log's last lines. None while it runs, or when this state_dir has no server of ours (an
    external endpoint, a GCE node). A server that just closed its socket may still be exiting:
    it gets `settle_seconds` to finish."""
    server = ManagedServer(SERVER_NAME, state_dir)
    deadline = time.monotonic() + settle_seconds
    while True:
        how = server.exited()
        if how is not None or server.record() is None or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if how is None:
        return None
    log = Path(state_dir) / f"{SERVER_NAME}.log"
    return (f"the inference server {how}, see its log {log} — phase 1 stopped asking it; "
            f"last lines:\n{tail(log, 8)}")


def stop_llama_server(state_dir: Path) -> bool:
    return ManagedServer(SERVER_NAME, state_dir).stop()


def llama_server_running(state_dir: Path) -> bool:
    return ManagedServer(SERVER_NAME, state_dir).running() is not None
