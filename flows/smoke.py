"""The node's smoke test, the operator's first command on a new project
(`slm-nightly node smoke --profile gcp`): boot the GCE node, wait for its engine, send one
structured request, release the GPU, run one training step on a few rows through the node's
deployment (the dataset pushed as the nightly pushes it), and stop the node — whatever
happened before. The steps are tasks/night/smoke.py's.
"""

from __future__ import annotations

from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any

import httpx
from prefect import flow

from blocks.inference import server_root
from tasks.night.clock import night_budget
from tasks.night.smoke import Smoke, environment, one_request, one_step
from tasks.preflight.node import template_thinks
from tasks.profile import Profile, load_profile
from tasks.records import SmokeResult
from tasks.shared.errors import ConfigError
from tasks.shared.slots import NIGHTLY_SLOT_WAIT_SECONDS, held_by, nightly_slot


@flow(name="node-smoke")
def node_smoke(profile: str = "gcp", train_timeout_seconds: int = 3600) -> SmokeResult:
    """Boot → engine → one request → engine down → one training step → the node's environment
    against this one → stop (always), holding
    the `nightly` slot throughout. Never raises for a failed phase: the result's verdict and
    error say how it ended."""
    cfg = load_profile(profile)
    if not cfg.node.remote_training:
        raise ConfigError(f"node smoke: profile {profile} has no remote node ([compute] type "
                          "= \"gce\"); the local node is tested by `slm-nightly run`")
    node = cfg.node
    smoke = Smoke()
    error = None
    with ExitStack() as stack:
        # The node is the smoke's, as it is a nightly's: the `nightly` slot tells the reaper
        # (hourly, and at every nightly's start) to leave it up, and a nightly that starts
        # meanwhile waits for the slot, then fails with its holder named.
        try:
            stack.enter_context(nightly_slot(timeout_seconds=NIGHTLY_SLOT_WAIT_SECONDS))
        except TimeoutError:
            error = (f"the 'nightly' slot is held (holders: {held_by()}): a nightly run or another "
                     "smoke owns the node — wait for it, or cancel it")
            print(f"smoke: failed — {error}", flush=True)
            return SmokeResult(phases=[], verdict="failed", error=error)
        return _phases(cfg, profile, node, smoke, train_timeout_seconds)


def _phases(cfg: Profile, profile: str, node: Any, smoke: Smoke,
            train_timeout_seconds: int) -> SmokeResult:
    error = None
    try:
        with smoke.phase("boot") as p:  # Compute stops it by itself should this process die
            written = node.prepare(cfg.inference)  # the script the profile renders
            p.detail = node.start(night_budget(cfg, 0, train_timeout_seconds)) + (
                f"; startup script rewritten in {', '.join(written)}" if written else "")
        with smoke.phase("engine") as p:
            base_url = node.start_inference(cfg.inference)
            p.detail = f"ready at {base_url}"
            if cfg.inference.reasoning_budget_tokens is not None:
                p.detail += f"; {served_template_thinks(cfg, base_url)}"
        with smoke.phase("request") as p:
            p.detail = one_request(cfg, base_url)
        with smoke.phase("engine down") as p:
            node.stop_inference()
            p.detail = "the GPU is free"
        started = datetime.now(UTC).isoformat(timespec="seconds")
        with smoke.phase("train") as p:
            p.detail = one_step(cfg, profile, train_timeout_seconds)
        with smoke.phase("environment") as p:
            p.detail = environment(cfg, since=started)
    except Exception as e:  # noqa: BLE001 - recorded in its phase; the node stops below
        error = f"{type(e).__name__}: {e}"
    finally:
        with smoke.phase("stop") as p:
            p.detail = f"stopped: {', '.join(node.stop()) or 'already down'}"
    result = SmokeResult(phases=smoke.phases, verdict="passed" if error is None else "failed",
                         error=error)
    print(f"smoke: {result.verdict}" + (f" — {error}" if error else ""), flush=True)
    return result


def served_template_thinks(cfg: Profile, base_url: str) -> str:
    """With [inference] reasoning_budget_tokens set, the served chat template (GET /props) must
    mark reasoning as llama-server detects it (tasks.preflight.node.template_thinks: a thinking
    end tag after reasoning_content; /props chat_template_caps.supports_preserve_reasoning),
    or the server drops the budget: ConfigError naming the fix."""
    key = cfg.inference.api_key.get_secret_value() if cfg.inference.api_key else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    props = httpx.get(f"{server_root(base_url)}/props", headers=headers, timeout=30)
    props.raise_for_status()
    return template_verdict(props.json(), cfg.inference.reasoning_budget_tokens)


def template_verdict(props: dict[str, Any], budget: int | None) -> str:
    """What the engine's /props says of a reasoning budget: the detail, or ConfigError."""
    caps = props.get("chat_template_caps") or {}
    if caps.get("supports_preserve_reasoning") and template_thinks(props.get("chat_template", "")):
        return f"its chat template marks reasoning: the budget of {budget} tokens is honoured"
    raise ConfigError(
        f"[inference] reasoning_budget_tokens = {budget}, but the engine's chat template marks no "
        "reasoning (GET /props: chat_template_caps.supports_preserve_reasoning = "
        f"{str(bool(caps.get('supports_preserve_reasoning'))).lower()}, no thinking end tag "
        "after reasoning_content): llama-server drops the budget — set [compute.node] "
        "chat_template_file = \"tasks/compute/templates/olmo3-think.jinja\", or unset "
        "[inference] reasoning_budget_tokens")
