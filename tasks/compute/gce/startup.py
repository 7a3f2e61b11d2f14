"""What runs on the GPU node: the engine's command line (llama.cpp's server or `vllm serve`)
and the instance startup script that starts it, a watcher, and a Prefect worker on the node's
work pool, rendered from the block's NodeServeSettings (blocks/node_serve.py).

Listening address. Every server this project starts *locally* binds 127.0.0.1 and the launch
functions refuse 0.0.0.0 outright. On the node, though, the flow reaches the engine from
another machine over the VPC, so it must listen on the node's VPC address: the startup script
reads it from the metadata server (instance/network-interfaces/0/ip) and passes it as
`--host`. That binds the one internal interface (no external IP is needed or used), and the
firewall rule should admit the port from the orchestrator's subnet only.

Offline by construction: the engine and the worker (whose flow runs inherit its environment)
run with HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1 and a fixed HF_HOME, as the service user,
from the node's one environment ({project_dir}/.venv); the tokenizer is a local folder.

Failures. The script runs under `set -e` with an ERR trap: whatever fails (a secret that
cannot be read, a missing model file, the metadata server) is written to the guest attribute
`slm/startup-error` as "<epoch seconds> <message>" before the script exits non-zero. An
engine that fails after the script (a CUDA out-of-memory at load, a missing library) is
written to `slm/engine-error` by the unit's ExecStopPost, with its result, exit status, how
often it failed this boot and its last log lines (a stop writes nothing). boot_status.py reads
both, so the orchestrator's readiness wait fails within seconds with the cause. Guest
attributes must be enabled on the instance (metadata `enable-guest-attributes=TRUE`, which
install_startup_script sets).

The script is the template startup.sh (with worker.sh when the node runs a worker), checked in
and shipped as package data: its placeholders are @{name}, so bash's own $VAR and ${…} need no
escaping; the parts that depend on the settings are rendered here.

vLLM flags are those of vLLM ≥ 0.11 (`--structured-outputs-config`, `--reasoning-parser
olmo3`); llama-server's are those of the llama.cpp that llama-cpp-python 0.3.36 vendors
(common/arg.cpp; tasks/compute/inference_server.py llama_server_args).
"""

from __future__ import annotations

import json
import shlex
from importlib.resources import files
from string import Template
from typing import Any

from blocks.inference import InferenceEndpoint
from blocks.node_serve import NodeServeSettings
from tasks.compute.engines import chat_template_on_node, worker_command
from tasks.compute.inference_server import Served, ServerSettings, llama_server_args

VPC_IP = "$VPC_IP"  # placeholder in argv: the startup script expands it on the node
# Instance metadata key the node's watcher obeys: running | stopped (whichever the engine).
# An instance's older `slm-vllm` is left unread: prepare() rewrites the startup script, and so
# the watcher, before every start.
ENGINE_STATE_KEY = "slm-engine"
METADATA = "http://metadata.google.internal/computeMetadata/v1/instance"
ERROR_ATTRIBUTE = "slm/startup-error"  # guest attribute namespace/key of a startup failure
ENGINE_ERROR_ATTRIBUTE = "slm/engine-error"  # … of an engine that failed after the script
ENGINE_UNIT = "slm-engine"
WATCH_UNIT = "slm-engine-watch"
WORKER_UNIT = "slm-prefect-worker"
WATCH_SECONDS = 2  # how often the watcher reads ENGINE_STATE_KEY (the metadata server is local)
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _check_host(host: str, who: str) -> None:
    if host in {"0.0.0.0", "::", ""}:
        raise ValueError(f"{who}: host {host!r} would listen on every interface — pass the "
                         "node's VPC address (the startup script's $VPC_IP) or 127.0.0.1")


def vllm_launch_args(endpoint: InferenceEndpoint, lora_modules: dict[str, str] | None = None,
                     *, host: str = VPC_IP, port: int = 9080,
                     settings: NodeServeSettings | None = None) -> list[str]:
    """The `vllm serve` argv for the node. `lora_modules` maps served adapter name → adapter
    path on the node; with any, LoRA is enabled. `host` defaults to the VPC-address
    placeholder the startup script fills in; 0.0.0.0 is refused."""
    s = settings or NodeServeSettings(engine="vllm")
    _check_host(host, "vllm_launch_args")
    argv = [
        s.venv_bin("vllm"), "serve", s.model_path,
        "--tokenizer", s.tokenizer,
        "--served-model-name", endpoint.model,
        "--host", host,
        "--port", str(port),
        "--max-model-len", str(endpoint.context_tokens),
        "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}",
        "--structured-outputs-config", json.dumps({"backend": s.structured_outputs_backend}),
    ]
    if s.reasoning_parser:
        argv += ["--reasoning-parser", s.reasoning_parser]
    if s.max_num_seqs:
        argv += ["--max-num-seqs", str(s.max_num_seqs)]
    # An API key is never put in argv (visible in `ps`, and in metadata via the startup
    # script): vLLM reads VLLM_API_KEY from its environment, which the startup script sets.
    if lora_modules:
        argv += ["--enable-lora", "--max-lora-rank", str(s.max_lora_rank),
                 "--max-loras", str(len(lora_modules)), "--lora-modules"]
        for name, path in lora_modules.items():
            if not name or "=" in name or " " in name:
                raise ValueError(f"vllm_launch_args: LoRA name {name!r} must be non-empty, with no "
                                 "'=' or spaces")
            if not path.startswith("/"):
                raise ValueError(f"vllm_launch_args: LoRA {name!r} path {path!r} must be an "
                                 "absolute path on the node")
            argv.append(f"{name}={path}")
    return argv + list(s.extra_args)


def llama_cpp_launch_args(endpoint: InferenceEndpoint, *, host: str = VPC_IP, port: int = 9080,
                          settings: NodeServeSettings | None = None) -> list[str]:
    """llama.cpp's own server on the node (`{project_dir}/.venv/bin/llama-server`, built for
    CUDA by `python -m tasks.engine.llama_build install --variant cuda`): the endpoint's
    max_concurrent_requests slots of context_tokens each, every layer on the L4, the GGUF's own
    tokenizer, the chat template of chat_template_file (empty: the GGUF's own), exactly one
    alias (the model name the client asks for).
    `--no-slots`: /slots would show any caller on the VPC the prompts being processed (the
    night's documents); the benches read slots on the local server only. The API key, if any,
    comes from its environment (LLAMA_API_KEY), never argv."""
    s = settings or NodeServeSettings()
    _check_host(host, "llama_cpp_launch_args")
    kv = ["-ctk", s.kv_cache_type, "-ctv", s.kv_cache_type]
    if s.kv_cache_type != "f16":
        kv += ["-fa", "on"]  # a quantized V cache needs flash attention
    template = chat_template_on_node(s)  # what lets it honour a reasoning budget
    tmpl = ["--chat-template-file", template] if template else []
    return llama_server_args(
        s.venv_bin("llama-server"), Served(s.model_path, endpoint.model), ServerSettings(
            slots=endpoint.max_concurrent_requests, context_tokens=endpoint.context_tokens,
            threads=s.engine_threads,
            gpu_layers="all" if s.n_gpu_layers == -1 else str(s.n_gpu_layers),
            cache_ram_mib=s.cache_ram_mib, ctx_checkpoints=s.ctx_checkpoints,
            cache_idle_slots=s.cache_idle_slots,
            extra=["--no-slots", *kv, *tmpl, *s.extra_args]), host=host, port=port)


def engine_launch_args(endpoint: InferenceEndpoint, lora_modules: dict[str, str] | None = None,
                       *, host: str = VPC_IP, port: int = 9080,
                       settings: NodeServeSettings | None = None) -> list[str]:
    """The command line of the node's engine (`settings.engine`)."""
    s = settings or NodeServeSettings()
    if s.engine == "vllm":
        return vllm_launch_args(endpoint, lora_modules, host=host, port=port, settings=s)
    if lora_modules:
        raise ValueError("engine_launch_args: the llama.cpp engine serves no LoRA modules on the "
                         "node — pass none, or set [compute.node] engine = \"vllm\"")
    return llama_cpp_launch_args(endpoint, host=host, port=port, settings=s)


def _shell(argv: list[str]) -> str:
    """Quote argv for bash, leaving the $VPC_IP placeholder to expand."""
    out = []
    for a in argv:
        out.append(f'"{a}"' if a == VPC_IP else shlex.quote(a))
    return " ".join(out)


def _offline_env(s: NodeServeSettings) -> str:
    """The systemd Environment= line that keeps a unit off the hub."""
    return "Environment=" + " ".join(f"{k}={v}" for k, v in
                                     {**OFFLINE, "HF_HOME": s.hf_home}.items())


def _unit(s: NodeServeSettings, description: str, env_file: str, exec_start: str,
          *service: str, wanted_by: str | None = None) -> str:
    """A systemd service unit of the node (systemd.service(5)): after the network, as the
    service user, from the project's folder, off the hub, with its own environment file;
    `service`: the unit's own [Service] lines (restart, kill); `wanted_by`: its [Install]
    target, for a unit enabled at boot (the engine has none: the watcher starts it)."""
    lines = ["[Unit]", f"Description={description}", "After=network-online.target",
             "[Service]", f"User={s.service_user}", f"WorkingDirectory={s.project_dir}",
             _offline_env(s), f"EnvironmentFile={env_file}", f"ExecStart={exec_start}",
             *service]
    if wanted_by:
        lines += ["[Install]", f"WantedBy={wanted_by}"]
    return "\n".join(lines)


def _service_user(s: NodeServeSettings) -> str:
    user, q = s.service_user, shlex.quote
    owned = []
    for path in (s.hf_home, s.project_dir):  # chown -R only when the image left it to root
        owned.append(f'[ "$(stat -c %U {q(path)})" = {user} ] || chown -R {user}: {q(path)}')
    return (f"id -u {user} >/dev/null 2>&1 || useradd --system --create-home "
            f"--shell /usr/sbin/nologin {user}\n"
            f"mkdir -p {q(s.hf_home)}\n" + "\n".join(owned))


def _image_checks(s: NodeServeSettings) -> str:
    """Fail early, naming the fix, when the image lacks what the units need."""
    q = shlex.quote
    fix = "build the node image as docs/operator-gcp.md (section 3) says"
    engine_bin = s.venv_bin("vllm" if s.engine == "vllm" else "llama-server")
    checks = [
        (f"[ -x {q(engine_bin)} ]", f"{engine_bin} is missing — {fix}"),
        (f"[ -f {q(s.model_path)} ]", f"model {s.model_path} is missing — run the "
                                      "weights-preparation command on the image"),
    ]
    template = chat_template_on_node(s)
    if s.engine == "llama.cpp" and template:
        checks.append((f"[ -f {q(template)} ]", f"chat template {template} is missing — update "
                       "the checkout on the node, or fix [compute.node] chat_template_file"))
    if s.engine == "vllm":
        checks.append((f"[ -d {q(s.tokenizer)} ]", f"tokenizer folder {s.tokenizer} is missing "
                                                   "— run the weights-preparation command"))
    if s.prefect_api_url:
        prefect = s.venv_bin("prefect")
        checks.append((f"[ -x {q(prefect)} ]", f"the worker's {prefect} is missing — {fix}"))
    return "\n".join(f"{test} || fail {q(msg)}" for test, msg in checks)


class _Template(Template):
    # bash's own `$VAR`s and `${…}` pass through untouched: placeholders are @{name}
    delimiter = "@"


def _template(name: str) -> _Template:
    return _Template(files("tasks.compute.gce").joinpath(name).read_text(encoding="utf-8"))


def _worker(s: NodeServeSettings) -> str:
    if not s.prefect_api_url:
        return "# no prefect_api_url in [compute.node]: this node runs no Prefect worker\n"
    unit = _unit(s, f"Prefect worker ({s.work_pool})", "/etc/slm-prefect.env",
                 _shell(worker_command(s)), "Restart=always", wanted_by="multi-user.target")
    return _template("worker.sh").substitute(
        prefect_api_url=shlex.quote(s.prefect_api_url), worker_unit=WORKER_UNIT,
        worker_service=unit)


def render_startup_script(endpoint: InferenceEndpoint, lora_modules: dict[str, str] | None = None,
                          *, port: int = 9080, settings: NodeServeSettings | None = None,
                          api_key_secret: str | None = None) -> str:
    """The instance's `startup-script` metadata value (startup.sh, with worker.sh when the node
    runs a worker): the service user, the engine on the VPC address as a systemd unit, a
    watcher that stops/starts it when metadata `slm-engine` changes (stopped | running), and a
    Prefect worker on the node's pool — every failure written to the guest attribute
    slm/startup-error.

    `api_key_secret`: Secret Manager secret with the engine's API key, when the endpoint has one."""
    s = settings or NodeServeSettings()
    serve = _shell(engine_launch_args(endpoint, lora_modules, port=port, settings=s))
    if endpoint.api_key is not None and not api_key_secret:
        raise ValueError("render_startup_script: the inference endpoint has an api_key — set "
                         "[compute.node] engine_api_key_secret (a Secret Manager secret the node "
                         "can read) so the key never lands in instance metadata")
    key_var = "VLLM_API_KEY" if s.engine == "vllm" else "LLAMA_API_KEY"  # what each reads
    # every secret is read before anything starts: a failed read starts nothing
    key_line = f"secret {shlex.quote(api_key_secret)} ENGINE_API_KEY\n" if api_key_secret else ""
    if s.prefect_api_url:
        key_line += (f"secret {shlex.quote(s.prefect_api_key_secret)} PREFECT_API_KEY\n"
                     if s.prefect_api_key_secret else "PREFECT_API_KEY=\n")
        key_line += (f"secret {shlex.quote(s.prefect_auth_string_secret)} "
                     "PREFECT_API_AUTH_STRING\n" if s.prefect_auth_string_secret else
                     "PREFECT_API_AUTH_STRING=\n")
    return _template("startup.sh").substitute(
        error_attribute=ERROR_ATTRIBUTE, engine_error_attribute=ENGINE_ERROR_ATTRIBUTE,
        metadata=METADATA, secret_lines=key_line,
        image_checks=_image_checks(s), service_user=_service_user(s), key_var=key_var,
        engine=s.engine, port=port, engine_unit=ENGINE_UNIT, serve=serve,
        engine_service=_unit(s, f"slm-nightly engine ({s.engine}: {endpoint.model})",
                             "/etc/slm-engine.env", f"/usr/local/bin/{ENGINE_UNIT}-serve",
                             "Restart=on-failure", "KillMode=control-group",
                             "TimeoutStopSec=60",
                             f"ExecStopPost=+/usr/local/bin/{ENGINE_UNIT}-failed"),
        state_key=ENGINE_STATE_KEY, watch_unit=WATCH_UNIT,
        watch_seconds=WATCH_SECONDS, worker=_worker(s))


def metadata_items(current: list[dict[str, Any]], updates: dict[str, str]) -> list[dict[str, str]]:
    """Merge `updates` into instance metadata items, keeping every other key."""
    merged = {i["key"]: i.get("value", "") for i in current}
    merged.update(updates)
    return [{"key": k, "value": v} for k, v in merged.items()]
