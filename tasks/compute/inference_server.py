"""The local inference server (llama.cpp's own `llama-server`, built by tasks/engine/llama_build.py),
its command line (the GPU node's too) and readiness polling."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from blocks.inference import server_root
from tasks.engine.llama_cpp import require_server
from tasks.shared import waiting
from tasks.shared.errors import ServerError
from tasks.shared.processes import ManagedServer, free_port, tail

SERVER_NAME = "inference"


def models_ready(base_url: str, api_key: str | None = None, timeout: float = 5.0) -> bool:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{server_root(base_url)}/v1/models", headers=headers, timeout=timeout)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and bool(r.json().get("data"))


def probe(base_url: str, api_key: str | None = None, timeout: float = 5.0
          ) -> tuple[str, list[str]]:
    """Where a vLLM-style server is on its way up: ("down" | "loading" | "unhealthy" |
    "no models" | "ready", the model ids it lists). /health first (cheap; 200 while the engine lives),
    then /v1/models."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base_url = server_root(base_url)  # http://host:9080/v1 (the OpenAI SDK's form) too
    try:
        h = httpx.get(f"{base_url}/health", headers=headers, timeout=timeout)
        if h.status_code == 503:  # llama-server while it loads the model ("Loading model")
            return "loading the model (GET /health: HTTP 503)", []
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
    if not waiting.poll(lambda: models_ready(base_url, api_key), timeout, first=poll,
                        factor=1.5, cap=max_poll):
        raise ServerError(f"inference endpoint {base_url} not ready after {timeout:.0f} s "
                          "(GET /v1/models) — check the server log, or raise the inference "
                          "block's readiness_timeout_seconds")
    return time.monotonic() - start


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


@dataclass(frozen=True)
class Served:
    """What llama-server serves: the GGUF, the model's name, and a LoRA adapter on it (None:
    the base alone), which is served under the name and under each of `adapter_names` too."""

    model: str | Path
    name: str
    adapter: str | Path | None = None
    adapter_names: tuple[str, ...] = ()

    @property
    def aliases(self) -> list[str]:
        """The names it answers to (one `-a` list): the model's, then the adapter's."""
        return [self.name, *(self.adapter_names if self.adapter else ())]


@dataclass(frozen=True)
class ServerSettings:
    """How llama-server runs, whatever it serves: `slots` slots of `context_tokens` each, its
    CPU threads, the layers on the GPU (None: the CPU build), its host-RAM caches (None: the
    flag is left out, llama-server's own default) and flags appended as they are."""

    slots: int
    context_tokens: int
    threads: int
    gpu_layers: str | None = None
    cache_ram_mib: int | None = None
    ctx_checkpoints: int | None = None
    cache_idle_slots: bool | None = None
    extra: Sequence[str] = ()


def llama_server_args(binary: str | Path, served: Served, settings: ServerSettings, *,
                      host: str, port: int) -> list[str]:
    """llama.cpp's own server (`llama-server`, tools/server of the llama.cpp the pinned
    llama-cpp-python vendors; flags from its common/arg.cpp):

    - `-np slots -c slots x context_tokens`: `-c` is the whole KV cache, split evenly across
      the slots, so every slot gets the context the client sizes its chunks for; requests
      beyond the slots wait in the server's queue (never a 429). One alias list (`-a`): the
      model's name and the names an adapter is served under; the server keeps them as a set
      (common/arg.cpp `model_alias`), so /v1/models lists them sorted, not in this order.
    - `-ngl`: "all" on the GPU, with `--fit off` (`-ngl -1` means "auto" here, and the fitter
      may move layers off the card); None on the CPU build (no flag: it would only warn).
    - `--lora` applies the adapter at scale 1 to every request that names it (the client
      sends an explicit `lora` list: a request without one can reuse a prompt cache computed
      under another adapter setting, upstream #26207).
    - `--cache-ram`: the host-RAM prompt cache, 8 GiB unless capped (0: none).
      `--ctx-checkpoints`: the copies of a slot's sliding-window cache it keeps in host RAM
      (32 unless capped; --cache-ram does not bound them). `--[no-]cache-idle-slots`: whether
      idle slots are saved to the prompt cache (on unless said; common/common.h
      `cache_idle_slots`). tasks/compute/host_memory.py estimates what they hold.
    - `--metrics` exposes /metrics (tokens/s per server, for the benches); the API key, if
      any, comes from LLAMA_API_KEY in its environment, never argv.
    """
    s = settings
    if host in {"0.0.0.0", "::", ""}:
        raise ValueError(f"llama_server_args: host {host!r} would listen on every interface")
    aliases = served.aliases
    if not aliases or any("," in a or not a.strip() for a in aliases):
        raise ValueError(f"llama_server_args: aliases {aliases!r} must be non-empty names "
                         "without commas")
    argv = [str(binary), "-m", str(served.model), "-a", ",".join(dict.fromkeys(aliases)),
            "--host", host, "--port", str(port),
            "-np", str(s.slots), "-c", str(s.slots * s.context_tokens),
            "-t", str(s.threads), "-tb", str(s.threads), "--metrics", "--no-webui"]
    if s.gpu_layers is not None:
        argv += ["-ngl", s.gpu_layers, "--fit", "off"]
    if served.adapter is not None:
        argv += ["--lora", str(served.adapter)]
    if s.cache_ram_mib is not None:
        argv += ["--cache-ram", str(s.cache_ram_mib)]
    if s.ctx_checkpoints is not None:
        argv += ["--ctx-checkpoints", str(s.ctx_checkpoints)]
    if s.cache_idle_slots is not None:
        argv.append("--cache-idle-slots" if s.cache_idle_slots else "--no-cache-idle-slots")
    return argv + list(s.extra)


def server_ready(base_url: str, api_key: str | None = None, timeout: float = 5.0) -> bool:
    """llama-server is up when /health answers 200 (503 while the model loads) and /v1/models
    lists the model."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        if httpx.get(f"{server_root(base_url)}/health", headers=headers,
                     timeout=timeout).status_code != 200:
            return False
    except httpx.HTTPError:
        return False
    return models_ready(base_url, api_key, timeout)


def loaded_adapters(base_url: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """llama-server's GET /lora-adapters: [{"id", "path", "scale", …}] (404 on other servers:
    an empty list)."""
    r = httpx.get(f"{server_root(base_url)}/lora-adapters", timeout=timeout)
    return list(r.json()) if r.status_code == 200 else []


# The local server's host-RAM prompt cache: the CPU model's prompts are small; 8 GiB (the
# default) is a third of a 24 GiB machine.
LOCAL_CACHE_RAM_MIB = 1024
# Flash attention off on the CPU: llama-server's `-fa auto` turns it on, and it decoded 1.6x
# slower here (SmolLM2, 1 thread, ~700-token context: 42-50 against 75 tokens/s). The GPU
# node keeps it (a quantized V cache needs it).
LOCAL_EXTRA = ("-fa", "off")


def start_llama_server(state_dir: Path, served: Served, n_ctx: int, n_threads: int,
                       readiness_timeout: float, slots: int = 1) -> str:
    """Start llama-server on a free loopback port with `slots` slots of `n_ctx` tokens each;
    return its base URL. With `served.adapter`, the GGUF LoRA adapter is checked to load, then
    served on the base — under `served.name` and under each of `served.adapter_names` (the
    bucket's name it is published as) — and the server's /lora-adapters must list it."""
    binary = require_server()
    server = ManagedServer(SERVER_NAME, state_dir)
    server.stop()  # a leftover from a crashed run would hold the CPU
    adapter = served.adapter
    if adapter is not None:
        check_adapter_loads(Path(served.model), Path(adapter))
    port = free_port()
    argv = llama_server_args(binary, served, ServerSettings(
        slots=slots, context_tokens=n_ctx, threads=n_threads, cache_ram_mib=LOCAL_CACHE_RAM_MIB,
        extra=LOCAL_EXTRA), host="127.0.0.1", port=port)
    base_url = f"http://127.0.0.1:{port}"
    server.start(argv, port, marker=f"--port {port}", ready=lambda: server_ready(base_url),
                 timeout=readiness_timeout)
    if adapter is not None:
        paths = [a.get("path") for a in loaded_adapters(base_url)]
        if str(adapter) not in paths:
            server.stop()
            raise ServerError(f"inference server started without adapter {adapter} (GET "
                              f"/lora-adapters lists {paths}; see {server.state_dir / SERVER_NAME}"
                              ".log) — roll the adapter back (slm-nightly adapters rollback "
                              "BUCKET)")
    return base_url


def server_exit(state_dir: Path, settle_seconds: float = 1.0) -> str | None:
    """Why the local inference server is gone, when it died under the run (it was started and
    not stopped): "the inference server exited with signal 4 (SIGILL), see its log …" with the
    log's last lines. None while it runs, or when this state_dir has no server of ours (an
    external endpoint, a GCE node). A server that just closed its socket may still be exiting:
    it gets `settle_seconds` to finish."""
    server = ManagedServer(SERVER_NAME, state_dir)

    def gone() -> str | None:
        # how it exited; "" when no server of ours is recorded (nothing to wait for)
        how = server.exited()
        return how if how is not None or server.record() is not None else ""

    how = waiting.poll(gone, settle_seconds, first=0.1, factor=1.0, cap=0.1)
    if not how:
        return None
    log = Path(state_dir) / f"{SERVER_NAME}.log"
    return (f"the inference server {how}, see its log {log} — phase 1 stopped asking it; "
            f"last lines:\n{tail(log, 8)}")


def stop_llama_server(state_dir: Path) -> bool:
    return ManagedServer(SERVER_NAME, state_dir).stop()


def llama_server_running(state_dir: Path) -> bool:
    return ManagedServer(SERVER_NAME, state_dir).running() is not None
