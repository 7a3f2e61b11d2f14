"""The night's preflight, the node's side: its engine loads the model and speaks the
inference block's dialect, llama-server's slots fit the card and its host caches the node's
RAM, its worker runs from the project's checkout against a Prefect API it reaches, and its
recorded environment fits this checkout."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from prefect.settings import PREFECT_API_KEY

from blocks.gce import GceCompute
from tasks.compute.engines import engine_problems, worker_command
from tasks.compute.host_memory import Host, host_fit, most_checkpoints, most_slots
from tasks.compute.kv_budget import Card, ModelShape, kv_fit, largest_fit
from tasks.shared.checks import Check, failure, passed, skipped
from tasks.shared.environment import REBUILD, RECORD_KEY, describe, differences, recorded
from tasks.shared.paths import PROJECT_ROOT

if TYPE_CHECKING:
    from tasks.profile import Profile

# profiles/gcp.toml's prefect_api_url until the operator sets it: refused by the preflight
PLACEHOLDER_MARKER = "ORCHESTRATOR_VPC_IP"
# hosts that, in the node's prefect_api_url, are the node itself and never the orchestrator
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


# --- the node: its engine and its worker ---------------------------------------------------------
def node_checks(cfg: Profile, block: GceCompute, training: bool,
                 node_ips: list[str]) -> Iterator[Check]:
    s = block.node
    problems = engine_problems(s, cfg.inference.dialect)
    for problem in problems:
        detail, _, fix = problem.rpartition(" — ")
        yield failure("engine", detail or problem, fix or "see the detail")
    if not problems:
        yield passed("engine", f"{s.engine} loads {s.model_architecture} ({s.model_path})")
    if s.engine == "llama.cpp":
        yield slots_check(s, cfg.inference.max_concurrent_requests,
                          cfg.inference.context_tokens)
        yield host_memory_check(s, cfg.inference.max_concurrent_requests,
                                cfg.inference.context_tokens)
        if cfg.inference.reasoning_budget_tokens is not None:
            yield reasoning_template_check(s, cfg.inference.reasoning_budget_tokens)
    if not s.prefect_api_url:
        yield (failure("node worker", "no prefect_api_url in [compute.node]: the node starts no "
                     "Prefect worker, and its training runs would wait for one",
                     "set [compute.node] prefect_api_url to the Prefect API as the node "
                     "reaches it") if training else
               skipped("node worker", "no prefect_api_url, and the night does not train"))
        return
    argv = worker_command(s)
    want = f"{s.project_dir.rstrip('/')}/.venv/bin/prefect"
    yield (passed("node worker", f"{' '.join(argv)} with PREFECT_API_URL {s.prefect_api_url}")
           if argv[0] == want else
           failure("node worker", f"the startup script starts {argv[0]}, not the project's "
                 f"{want}: its flow runs would lack torch, peft and prefect-gcp",
                 "start the worker from the node's checkout (tasks/compute/engines.py)"))
    yield _node_api_check(s.prefect_api_url, node_ips)


def _node_api_check(url: str, node_ips: list[str]) -> Check:
    """The node's prefect_api_url: not the shipped placeholder, not the orchestrator's loopback
    (on the node that is the node), and answering GET <url>/health here — the orchestrator is
    in the node's VPC. Loopback is allowed only for a node whose own internal IP is a loopback
    address: the fake Compute Engine's nodes, which run on this machine."""
    name = "node Prefect API"
    fix = ("set [compute.node] prefect_api_url to the Prefect API as the node reaches it over "
           "the VPC: http://<orchestrator VPC IP>:4200/api (`hostname -I` on the orchestrator), "
           "or the Prefect Cloud workspace URL")
    if PLACEHOLDER_MARKER in url or "REPLACE" in url:
        return failure(name, f"prefect_api_url {url} is the shipped placeholder", fix)
    host = (urlsplit(url).hostname or "").lower()
    on_this_machine = bool(node_ips) and all(ip.startswith("127.") for ip in node_ips)
    if host in LOOPBACK_HOSTS and not on_this_machine:
        return failure(name, f"prefect_api_url {url} is a loopback address: on the node it is "
                     "the node itself, not the orchestrator", fix)
    key = PREFECT_API_KEY.value()  # Prefect Cloud: its /health wants the key
    key = key.get_secret_value() if hasattr(key, "get_secret_value") else key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    health = url.rstrip("/") + "/health"
    try:
        resp = httpx.get(health, headers=headers, timeout=10)
        resp.raise_for_status()
    except httpx.HTTPError as e:
        return failure(name, f"GET {health} from the orchestrator failed: {type(e).__name__}: "
                     f"{str(e)[:200]}", "serve the Prefect API on the orchestrator's VPC "
                     "address (`prefect server start --host 0.0.0.0`) and let the node's subnet "
                     "reach port 4200 (a firewall rule), or fix [compute.node] prefect_api_url")
    return passed(name, f"GET {health} answers {resp.status_code}")


def slots_check(s: Any, slots: int, context_tokens: int) -> Check:
    """llama-server's slots (max_concurrent_requests x context_tokens) beside the weights on
    the node's card, by the estimate of tasks/compute/kv_budget.py: refused when they do not
    fit, with both numbers and the largest setting that does."""
    shape, card = ModelShape.of_node(s), Card.of_node(s)
    fit = kv_fit(slots, context_tokens, shape, card, s.kv_cache_type)
    if fit.fits:
        return passed("engine slots", fit.text())
    most = largest_fit(context_tokens, shape, card, s.kv_cache_type)
    other = "q8_0" if s.kv_cache_type == "f16" else None
    more = (f"; kv_cache_type = \"{other}\" fits "
            f"{largest_fit(context_tokens, shape, card, other)}" if other else "")
    return failure("engine slots", f"{fit.text()}: does not fit",
                 f"set [inference] max_concurrent_requests to {most} or less (the most slots "
                 f"of {context_tokens} tokens that fit){more}, or lower context_tokens"
                 if most else "lower context_tokens, or serve a smaller model")


# What llama-server renders an assistant turn's reasoning_content as, to find its markers
# (vendored common/chat-diff-analyzer.cpp compare_reasoning_presence)
_REASONING_PROBE = "REASON_PART I am thinking END_R"


def template_thinks(text: str) -> bool:
    """Whether llama-server would honour a reasoning budget under this chat template: as its
    template analysis (vendored common/chat-diff-analyzer.cpp) does, render a user turn and an
    assistant turn with `reasoning_content`, and look for the reasoning followed by an end tag
    (`</think>`). Without one the server drops `reasoning_budget_tokens`
    (tools/server/server-common.cpp: only with thinking end tags). A template that does not
    render is False (the server skips the detection too)."""
    def fail(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = fail
    messages = [{"role": "user", "content": "U_USER_MSG Hello END_U"},
                {"role": "assistant", "content": "A_ASST_MSG I can help END_A",
                 "reasoning_content": _REASONING_PROBE}]
    try:
        out = env.from_string(text).render(messages=messages, add_generation_prompt=False,
                                           enable_thinking=True, eos_token="<|endoftext|>",
                                           bos_token="", tools=None)
    except Exception:  # noqa: BLE001 - any template error: no reasoning found, as the server
        return False
    at = out.find(_REASONING_PROBE)
    return at >= 0 and re.match(r"\s*</[^<>\s]+>", out[at + len(_REASONING_PROBE):]) is not None


def reasoning_template_check(s: Any, budget: int | None) -> Check:
    """[inference] reasoning_budget_tokens needs a served chat template llama-server finds a
    thinking end tag in (template_thinks). The node's chat_template_file is read from this
    checkout (a relative one: the node runs the same checkout) or this machine (an absolute
    one); the GGUF's own template cannot be read here, and OLMo 3 Think's has no end tag."""
    name = "reasoning template"
    if budget is None:
        return skipped(name, "[inference] reasoning_budget_tokens is not set")
    path = s.chat_template_file
    fix = ("set [compute.node] chat_template_file = \"tasks/compute/templates/olmo3-think.jinja\" "
           "(OLMo 3 Think's template with reasoning_content between <think> and </think>), "
           "or unset [inference] reasoning_budget_tokens")
    if not path:
        return failure(name, f"[inference] reasoning_budget_tokens = {budget}, but [compute.node] "
                       "chat_template_file is empty: llama-server serves the GGUF's own chat "
                       "template, which cannot be checked here (OLMo 3 Think's has no </think>), "
                       "and drops the budget unless the template has a thinking end tag", fix)
    here = PROJECT_ROOT / path if not path.startswith("/") else Path(path)
    try:
        text = here.read_text(encoding="utf-8")
    except OSError as e:
        return failure(name, f"[inference] reasoning_budget_tokens = {budget}, but [compute.node] "
                       f"chat_template_file {path} cannot be read here ({here}: "
                       f"{type(e).__name__}) to check that it marks reasoning", fix)
    if not template_thinks(text):
        return failure(name, f"[inference] reasoning_budget_tokens = {budget}, but [compute.node] "
                       f"chat_template_file {path} renders no thinking end tag after an "
                       "assistant turn's reasoning_content: llama-server would drop the budget",
                       fix)
    return passed(name, f"{path} renders reasoning_content between thinking tags: the budget "
                  f"of {budget} tokens is honoured")


def host_memory_check(s: Any, slots: int, context_tokens: int) -> Check:
    """llama-server's host-RAM caches (its slots' context checkpoints, the prompt cache with
    the idle-slot saves inside it) beside the engine, the Prefect worker and the OS, against
    the node's RAM, by the estimate of tasks/compute/host_memory.py: refused when they do not
    fit, with both numbers and the settings that do."""
    shape, host = ModelShape.of_node(s), Host.of_node(s)
    fit = host_fit(slots, context_tokens, shape, s.kv_cache_type, host)
    if fit.fits:
        return passed("engine host memory", fit.text())
    fixes = []
    ckpts = most_checkpoints(slots, context_tokens, shape, s.kv_cache_type, host)
    if 0 <= ckpts < s.ctx_checkpoints:
        note = "; under 3 none survives to the next chunk" if ckpts < 3 else ""
        fixes.append(f"set [compute.node] ctx_checkpoints to {ckpts} or less (the most per "
                     f"slot that fit{note})")
    if s.cache_ram_mib:
        fixes.append("set [compute.node] cache_ram_mib = 0 (the night's distinct chunks do not "
                     "reuse the prompt cache)")
    most = most_slots(context_tokens, shape, s.kv_cache_type, host)
    if most:
        fixes.append(f"set [inference] max_concurrent_requests to {most} or less (the most "
                     "slots that fit)")
    return failure("engine host memory", f"{fit.text()}: does not fit",
                   "; or ".join(fixes) or "serve on a machine type with more RAM and set "
                   "[compute.node] host_memory_gib")


# --- the node's environment ---------------------------------------------------------------------
def environment_check(cfg: Profile, training: bool) -> Check:
    """The environment the node's last training run recorded in the bucket against this
    checkout's pyproject.toml and this machine's versions (tasks/shared/environment.py)."""
    name = "node environment"
    if not training or not cfg.training.gcs_block:
        return skipped(name, "the night does not train on the node through a bucket")
    try:
        node = recorded(cfg.training.gcs_block)
    except Exception as e:  # noqa: BLE001 - the bucket checks above name the cause
        return skipped(name, f"not read: {type(e).__name__}: {str(e)[:200]}")
    if node is None:
        return skipped(name, f"no node run has recorded its environment yet ({RECORD_KEY}): "
                     "`slm-nightly node smoke` does")
    refused, said = differences(describe(), node)
    if refused:
        return failure(name, f"the node's environment {node.get('digest')} (recorded "
                     f"{node.get('at')}) does not fit this checkout's code: "
                     f"{'; '.join(refused)}", REBUILD)
    return passed(name, f"{node.get('digest')} (recorded {node.get('at')}) fits pyproject.toml"
               + (f"; within its ranges: {'; '.join(said)}" if said else ""))


