"""The engine on a running GCE node, from the orchestrator: the startup script's metadata, the
wait until the engine lists the model, and its stop through the watcher's metadata key.

The node's startup script (startup.sh) runs a watcher that obeys the instance metadata key
`slm-engine` (`stopped` | `running`): `stop` sets it to `stopped` and then checks that the
engine's port no longer answers; the wait sets it back to `running`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from blocks.gce import GceCompute
from blocks.inference import InferenceEndpoint
from tasks.compute import inference_server
from tasks.compute.gce.api import ComputeApi
from tasks.compute.gce.boot_status import ENGINE_KEY, KEY
from tasks.compute.gce.record import NodeRecord
from tasks.compute.gce.startup import ENGINE_STATE_KEY, ENGINE_UNIT, WATCH_UNIT, render_startup_script
from tasks.shared.errors import ConfigError, ServerError
from tasks.shared.processes import port_open
from tasks.shared.waiting import poll

BOOT_STATUS_SECONDS = 10.0  # how often the wait for the engine reads the startup script's error
STOP_SECONDS = 120.0  # the watcher's stop → the port closed


def script_metadata(block: GceCompute, endpoint: InferenceEndpoint,
                    lora_modules: dict[str, str] | None = None,
                    api_key_secret: str | None = None) -> dict[str, str]:
    """The metadata a node boots from: the startup script rendered from the blocks, and
    guest attributes on (off by default on Compute Engine: the script reports a failed
    boot through one, slm/startup-error, which the wait reads)."""
    serve = block.node  # the block's field keeps its saved name: the engine's settings
    try:
        script = render_startup_script(
            endpoint, lora_modules, port=block.inference_port, settings=serve,
            api_key_secret=api_key_secret or serve.engine_api_key_secret)
    except ValueError as e:
        raise ConfigError(f"compute (gce): {e}") from e
    return {"startup-script": script, "enable-guest-attributes": "TRUE"}


def wait_ready(api: ComputeApi, node: NodeRecord, endpoint: InferenceEndpoint,
               check_running: Callable[[], None],
               progress: Callable[[str], None]) -> str:
    """Wait until the engine on `node` lists the endpoint's model, calling `check_running`
    every poll_seconds and reading the startup script's error more often; the base URL."""
    b = api.block
    base_url = endpoint.base_url or f"http://{node.ip}:{b.inference_port}"
    key = endpoint.api_key.get_secret_value() if endpoint.api_key else None
    if api.get(node.zone).metadata.get(ENGINE_STATE_KEY) == "stopped":
        api.set_metadata(node.zone, {ENGINE_STATE_KEY: "running"})
    started = time.monotonic()
    timeout = endpoint.readiness_timeout_seconds
    # a failed boot is read from a guest attribute: cheap, so sooner than the status poll
    boot_every = min(b.poll_seconds, BOOT_STATUS_SECONDS)
    due = {"check": started + b.poll_seconds, "boot": started + boot_every,
           "report": started + b.progress_seconds}
    last = ["not probed"]

    def ready() -> list[str] | None:
        stage, models = inference_server.probe(base_url, key)
        if stage == "ready":
            return models
        last[0] = stage
        now = time.monotonic()
        if now >= due["report"]:
            progress(f"waiting for the engine at {base_url}: {stage} — "
                     f"{now - started:.0f} s of {timeout:.0f} s")
            due["report"] = now + b.progress_seconds
        if now >= due["check"]:
            check_running()
            due["check"] = now + b.poll_seconds
        if now >= due["boot"]:
            _raise_startup_failure(api, node)
            due["boot"] = now + boot_every
        return None

    models = poll(ready, timeout, first=1.0, factor=1.5, cap=10.0)
    if models is None:
        raise ServerError(
            f"inference endpoint {base_url} not ready after {timeout:.0f} s (last: "
            f"{last[0]}) — check the node's serial console / `journalctl -u {ENGINE_UNIT}` "
            f"on {node.instance}, or raise the inference block's readiness_timeout_seconds")
    if endpoint.model not in models:
        raise ConfigError(f"the engine at {base_url} serves {models}, not {endpoint.model!r} "
                          "— set the inference block's model to the node's served model name "
                          "(the startup script uses the block's model: re-run "
                          "install_startup_script after changing it)")
    progress(f"engine ready at {base_url} after {time.monotonic() - started:.0f} s "
             f"(serving {', '.join(models)})")
    return base_url


def _raise_startup_failure(api: ComputeApi, node: NodeRecord) -> None:
    """ServerError with the cause when the node's startup script, or its engine after it,
    reported a failure on this boot."""
    failures = api.boot_failures(node.zone, node.instance)
    if KEY in failures:
        raise ServerError(
            f"the startup script of {api.block.where(node.zone)} failed: {failures[KEY]} — "
            f"fix it and rerun; the whole log is in `journalctl -u google-startup-scripts` on "
            f"{node.instance} (the engine's: `journalctl -u {ENGINE_UNIT}`)")
    if ENGINE_KEY in failures:
        raise ServerError(
            f"the engine ({ENGINE_UNIT}) of {api.block.where(node.zone)} failed: "
            f"{failures[ENGINE_KEY]} — fix the cause (a CUDA out-of-memory at load: a smaller "
            f"context or fewer slots; a missing library: the image) and rerun; its whole log "
            f"is in `journalctl -u {ENGINE_UNIT}` on {node.instance}")


def stop(api: ComputeApi, node: NodeRecord) -> bool:
    """Set the watcher's key to `stopped` and wait until the engine's port closes; whether
    the engine was up."""
    port = api.block.inference_port
    url = f"http://{node.ip}:{port}"
    # the port, not /v1/models: an engine with an API key answers 401 to a probe without it
    was_up = port_open(port, node.ip)
    api.set_metadata(node.zone, {ENGINE_STATE_KEY: "stopped"})
    if not poll(lambda: not port_open(port, node.ip), STOP_SECONDS, first=0.5, factor=1.0,
                cap=0.5):
        raise ServerError(f"the engine on {node.instance} still answers at {url} "
                          f"{STOP_SECONDS:.0f} s after {ENGINE_STATE_KEY}=stopped — check the "
                          f"{WATCH_UNIT} unit on the node")
    return was_up


