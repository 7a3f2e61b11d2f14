"""What runs on the GPU node: the `vllm serve` command line and the instance startup script
that starts it (and a Prefect worker on the node's work pool), rendered from the block's
VllmServeSettings (blocks/vllm_node.py).

Listening address. Every server this project starts *locally* binds 127.0.0.1 and
`vllm_launch_args` refuses 0.0.0.0 outright. On the node, though, the flow reaches vLLM from
another machine over the VPC, so vLLM must listen on the node's VPC address: the startup
script reads it from the metadata server (instance/network-interfaces/0/ip) and passes it as
`--host`. That binds the one internal interface (no external IP is needed or used), and the
firewall rule should admit port 9080 from the orchestrator's subnet only.

vLLM flags are those of vLLM ≥ 0.11 (`--structured-outputs-config`, `--reasoning-parser olmo3`).
Check them against the vLLM version installed in the node image.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from blocks.inference import InferenceEndpoint
from blocks.vllm_node import VllmServeSettings

VPC_IP = "$VPC_IP"  # placeholder in argv: the startup script expands it on the node
AGENT_KEY = "slm-vllm"  # instance metadata key the node's watcher obeys: running | stopped
METADATA = "http://metadata.google.internal/computeMetadata/v1/instance"


def vllm_launch_args(endpoint: InferenceEndpoint, lora_modules: dict[str, str] | None = None,
                     *, host: str = VPC_IP, port: int = 9080,
                     settings: VllmServeSettings | None = None) -> list[str]:
    """The `vllm serve` argv for the node. `lora_modules` maps served adapter name → adapter
    path on the node; with any, LoRA is enabled. `host` defaults to the VPC-address
    placeholder the startup script fills in; 0.0.0.0 is refused."""
    s = settings or VllmServeSettings()
    if host in {"0.0.0.0", "::", ""}:
        raise ValueError(f"vllm_launch_args: host {host!r} would listen on every interface — "
                         "pass the node's VPC address (the startup script's $VPC_IP) or 127.0.0.1")
    argv = [
        s.vllm_bin, "serve", s.model_path,
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


def _shell(argv: list[str]) -> str:
    """Quote argv for bash, leaving the $VPC_IP placeholder to expand."""
    out = []
    for a in argv:
        out.append(f'"{a}"' if a == VPC_IP else shlex.quote(a))
    return " ".join(out)


def render_startup_script(endpoint: InferenceEndpoint, lora_modules: dict[str, str] | None = None,
                          *, port: int = 9080, settings: VllmServeSettings | None = None,
                          api_key_secret: str | None = None) -> str:
    """The instance's `startup-script` metadata value: start vLLM on the VPC address as a
    systemd unit, a watcher that stops/starts it when metadata `slm-vllm` changes
    (stopped | running), and a Prefect worker on the node's pool.

    `api_key_secret`: Secret Manager secret with vLLM's API key, when the endpoint has one."""
    s = settings or VllmServeSettings()
    serve = _shell(vllm_launch_args(endpoint, lora_modules, port=port, settings=s))
    if endpoint.api_key is not None and not api_key_secret:
        raise ValueError("render_startup_script: the inference endpoint has an api_key — pass "
                         "api_key_secret (a Secret Manager secret the node can read) so the key "
                         "never lands in instance metadata")
    key_line = (f"VLLM_API_KEY=$(gcloud secrets versions access latest "
                f"--secret={shlex.quote(api_key_secret)})\n" if api_key_secret else "")
    worker = ""
    if s.prefect_api_url:
        pkey = (f"PREFECT_API_KEY=$(gcloud secrets versions access latest "
                f"--secret={shlex.quote(s.prefect_api_key_secret)})\n"
                if s.prefect_api_key_secret else "PREFECT_API_KEY=\n")
        worker = f"""
# --- Prefect worker on the node's pool (runs phase-2 training once vLLM is stopped) ---
{pkey}install -m 600 /dev/null /etc/slm-prefect.env
printf 'PREFECT_API_URL=%s\\nPREFECT_API_KEY=%s\\n' {shlex.quote(s.prefect_api_url)} "$PREFECT_API_KEY" \\
  > /etc/slm-prefect.env
cat > /etc/systemd/system/slm-prefect-worker.service <<'UNIT'
[Unit]
Description=Prefect worker ({s.work_pool})
After=network-online.target
[Service]
EnvironmentFile=/etc/slm-prefect.env
ExecStart={s.prefect_bin} worker start --pool {shlex.quote(s.work_pool)} --type process
Restart=always
[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl restart slm-prefect-worker
"""
    return f"""#!/bin/bash
# Rendered by slm-nightly (tasks/compute/startup_script.py). Runs as root at every boot.
set -euo pipefail
MD={METADATA}
md() {{ curl -fsS -H 'Metadata-Flavor: Google' "$MD/$1"; }}
VPC_IP=$(md network-interfaces/0/ip)
{key_line}install -m 600 /dev/null /etc/slm-vllm.env
printf 'VPC_IP=%s\\n' "$VPC_IP" > /etc/slm-vllm.env
if [ -n "${{VLLM_API_KEY:-}}" ]; then printf 'VLLM_API_KEY=%s\\n' "$VLLM_API_KEY" >> /etc/slm-vllm.env; fi

# --- vLLM on the VPC address, port {port} ---
cat > /usr/local/bin/slm-vllm-serve <<'SERVE'
#!/bin/bash
exec {serve}
SERVE
chmod 755 /usr/local/bin/slm-vllm-serve
cat > /etc/systemd/system/slm-vllm.service <<'UNIT'
[Unit]
Description=vLLM ({endpoint.model})
After=network-online.target
[Service]
EnvironmentFile=/etc/slm-vllm.env
ExecStart=/usr/local/bin/slm-vllm-serve
Restart=on-failure
KillMode=control-group
TimeoutStopSec=60
UNIT

# --- watcher: metadata {AGENT_KEY}=stopped|running stops/starts vLLM (frees the GPU) ---
cat > /usr/local/bin/slm-vllm-watch <<'WATCH'
#!/bin/bash
MD={METADATA}
while true; do
  want=$(curl -fsS -H 'Metadata-Flavor: Google' "$MD/attributes/{AGENT_KEY}" 2>/dev/null || echo running)
  if [ "$want" = stopped ]; then systemctl stop slm-vllm
  elif ! systemctl is-active --quiet slm-vllm; then systemctl start slm-vllm; fi
  sleep 5
done
WATCH
chmod 755 /usr/local/bin/slm-vllm-watch
cat > /etc/systemd/system/slm-vllm-watch.service <<'UNIT'
[Unit]
Description=slm-nightly vLLM watcher
[Service]
ExecStart=/usr/local/bin/slm-vllm-watch
Restart=always
[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl restart slm-vllm-watch
{worker}"""


def metadata_items(current: list[dict[str, Any]], updates: dict[str, str]) -> list[dict[str, str]]:
    """Merge `updates` into instance metadata items, keeping every other key."""
    merged = {i["key"]: i.get("value", "") for i in current}
    merged.update(updates)
    return [{"key": k, "value": v} for k, v in merged.items()]
