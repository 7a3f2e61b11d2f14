"""How the GPU node serves the extraction model and runs its Prefect worker (the
`[compute.node]` table of a GCE profile): configuration only. The engine command lines and the
startup script built from them are tasks/compute/gce/startup.py; which engine can load
which model is tasks/compute/engines.py.

One environment on the node. `project_dir` is the node's checkout of this project with ONE
virtual environment, `.venv`, holding the project, its GPU build of torch and the engine:
llama-server and llama-cpp-python built for CUDA (`make install LLAMA_VARIANT=cuda`: the cuda
variant of tasks/engine/llama_build.py, then the project by uv), plus vLLM for the vllm engine
(`.venv/bin/uv pip install -e '.[gpu]'`). The worker is `{project_dir}/.venv/bin/prefect`
because Prefect's process worker starts each flow run with its own interpreter
(`sys.executable -m prefect.engine`): a worker from any other environment runs `train/node`
without torch, peft and prefect-gcp.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# llama-server flags that resize the KV cache (the vendored common/arg.cpp): a unified cache
# (-kvu: every slot may use the whole -c), another micro-batch (the sliding-window cache holds
# one), the sliding-window layers at full context (--swa-full)
KV_SHAPE_FLAGS = frozenset({"-kvu", "--kv-unified", "-ub", "--ubatch-size", "--swa-full"})
# llama-server flags that size its host-RAM caches, which the host-memory estimate sizes from
# ctx_checkpoints, cache_ram_mib and cache_idle_slots (common/arg.cpp: -ctxcp's three names,
# -cram, --cache-idle-slots and its negation)
HOST_CACHE_FLAGS = frozenset({"-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", "-cram",
                              "--cache-ram", "--cache-idle-slots", "--no-cache-idle-slots"})
# OLMo 3 Think's own chat template plus the line that renders `reasoning_content` between
# <think> and </think> (tasks/compute/templates/README.md: source, licence, diff), relative to the
# node's checkout: what lets llama-server honour a reasoning budget.
SHIPPED_TEMPLATE = "tasks/compute/templates/olmo3-think.jinja"

# Fields that no longer exist, and what replaced them (a profile that still sets one is told).
_REMOVED = {
    "prefect_bin": "the worker is {project_dir}/.venv/bin/prefect — set project_dir to the "
                   "node's checkout instead",
    "vllm_bin": "vLLM is {project_dir}/.venv/bin/vllm — set project_dir to the node's "
                "checkout instead",
}


class NodeServeSettings(BaseModel):
    """The node's engine (llama.cpp or vLLM on one L4, 24 GB), its offline boot and its worker."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    engine: Literal["llama.cpp", "vllm"] = "llama.cpp"
    """Inference engine on the node. llama.cpp (llama-server, built for CUDA by
    `python -m tasks.engine.llama_build install --variant cuda`) loads the OLMo 3 GGUF; vLLM does not
    (its GGUF loader has no olmo2: vllm-project/vllm#30691). Needs the inference block's dialect
    to match (llama.cpp → "llama.cpp", vllm → "vllm")."""
    project_dir: str = "/opt/slm-nightly"
    """The node's checkout of this project with its one .venv (the project, its GPU torch and
    the engine): the worker is {project_dir}/.venv/bin/prefect."""
    model_path: str = "/opt/models/Olmo-3-32B-Think-Q3_K_M.gguf"
    """GGUF weights on the node's disk (32B Think, Q3_K_M: ~16 GB, fits an L4)."""
    model_architecture: str = "olmo2"
    """The GGUF's general.architecture (llama.cpp's converter writes OLMo 3 as olmo2): checked
    against the engine's own list before the node boots."""
    tokenizer: str = "/opt/models/Olmo-3-32B-Think"
    """Absolute path of the model's tokenizer folder on the node (vLLM loads it; llama.cpp uses
    the GGUF's own). Never a hub id: the node boots offline."""
    hf_home: str = "/opt/slm-hf"
    """HF_HOME of the engine and the worker (the 7B training base is in its hub cache); the boot
    sets HF_HUB_OFFLINE=1, so nothing is downloaded."""
    service_user: str = "slm"
    """Unix user the engine and the worker run as (the startup script creates it if missing)."""

    # vLLM only.
    gpu_memory_utilization: float = Field(default=0.92, gt=0.1, le=0.98)
    """vLLM only."""
    structured_outputs_backend: str = "xgrammar"
    """vLLM only."""
    reasoning_parser: str | None = "olmo3"
    """vLLM only; empty for non-reasoning models (llama.cpp: the client strips the reasoning)."""
    max_lora_rank: int = Field(default=64, ge=1, le=512)
    """vLLM only."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """vLLM only; empty = vLLM's default."""

    # llama.cpp only.
    n_gpu_layers: int = Field(default=-1, ge=-1)
    """llama.cpp only: layers offloaded to the GPU (-1 = all, `-ngl all --fit off`; the 32B
    Q3_K_M fits an L4)."""
    kv_cache_type: Literal["f16", "q8_0"] = "f16"
    """llama.cpp only: the KV cache type (-ctk/-ctv; q8_0 turns flash attention on, which a
    quantized V cache needs): q8_0 holds about twice the slots of f16 on the same card."""
    engine_threads: int = Field(default=2, ge=1, le=64)
    """llama.cpp only: CPU threads of the engine (-t). With every layer on the L4 the CPU only
    samples and runs the grammar; the g2-standard-4's other vCPUs stay with the Prefect worker
    and its flow runs."""
    cache_ram_mib: int = Field(default=0, ge=0)
    """llama.cpp only: host RAM for the prompt cache (--cache-ram; 0 = none; llama-server's
    default is 8 GiB, half of a g2-standard-4). Off: the night's chunks are distinct, so a
    cached prompt shares only the system prompt with the next one, which the slot's own
    context checkpoint already restores; the cache would hold whole slot states (~0.7 GB each
    at 8192 tokens) that no later prompt uses. Off, it also turns off idle-slot saves."""
    ctx_checkpoints: int = Field(default=3, ge=0, le=32)
    """llama.cpp only: context checkpoints per slot (--ctx-checkpoints; llama-server's default
    is 32), each a host-RAM copy of the slot's sliding-window cache (0.40 GiB at q8_0 for OLMo
    3 32B, 0.75 at f16) that --cache-ram does not bound. A request makes three: at its last
    user message (the system prompt, which the next chunk restores instead of computing it
    again) and two near the prompt's end; with fewer, the first is evicted. 0 = none (every
    prompt computed whole). tasks/compute/host_memory.py estimates the RAM they need."""
    cache_idle_slots: bool = False
    """llama.cpp only: save idle slots to the prompt cache when a task starts
    (--cache-idle-slots; llama-server's default is on, and needs cache_ram_mib)."""
    host_memory_gib: float = Field(default=16.0, gt=0)
    """The node's RAM, GiB: a g2-standard-4's 16 GB (Compute Engine's GB are 2^30 bytes).
    Preflight checks llama-server's host caches, the Prefect worker and the OS fit it."""
    chat_template_file: str | None = SHIPPED_TEMPLATE
    """llama.cpp only: the chat template llama-server renders with (--chat-template-file). A
    relative path is a file of the node's checkout ({project_dir}/<path>), an absolute one a
    file on the node; empty = the GGUF's own template. The default, OLMo 3 Think's own template
    with `reasoning_content` rendered between <think> and </think>
    (tasks/compute/templates/README.md), is what lets the server honour [inference]
    reasoning_budget_tokens: it passes a budget on only when its template analysis finds a
    thinking end tag, which OLMo 3 Think's own template (and so its GGUF's) has not — the
    preflight refuses a budget the served template cannot honour."""

    # The model's shape, for the estimate of what fits on the card (tasks/compute/kv_budget.py);
    # the defaults are OLMo 3 32B's (its model card) at Q3_K_M.
    model_layers: int = Field(default=64, ge=1)
    """Transformer layers of the model."""
    model_kv_heads: int = Field(default=8, ge=1)
    """KV heads per layer."""
    model_head_dim: int = Field(default=128, ge=1)
    """Head dimension."""
    model_sliding_layers: int = Field(default=48, ge=0)
    """Layers with sliding-window attention (their KV cache holds the window only)."""
    model_sliding_window: int = Field(default=4096, ge=0)
    """Sliding window, tokens."""
    model_weights_gib: float = Field(default=15.0, gt=0)
    """The GGUF's size in GiB (the weights on the card)."""
    gpu_memory_gib: float = Field(default=22.5, gt=0)
    """Memory of the node's GPU that llama.cpp can use (an L4 reports 23034 MiB)."""

    extra_args: list[str] = Field(default_factory=list)
    """Appended to the engine's command line as they are; not the flags that resize the KV
    cache the slot estimate sizes (KV_SHAPE_FLAGS)."""

    # The node's Prefect worker.
    work_pool: str = "slm-node"
    """Pool the node's Prefect worker serves."""
    prefect_api_url: str | None = None
    """PREFECT_API_URL for the worker; empty = the node starts no worker."""
    prefect_api_key_secret: str | None = None
    """Secret Manager secret holding PREFECT_API_KEY (read on the node with the node's service
    account — never put the key itself in instance metadata, which anyone with
    compute.instances.get can read)."""
    prefect_auth_string_secret: str | None = None
    """Secret Manager secret holding PREFECT_API_AUTH_STRING (`user:password`) of a self-hosted
    Prefect server that requires one (`slm-nightly gcp setup` makes `slm-prefect-auth`); read
    on the node like the key, never put in metadata."""
    engine_api_key_secret: str | None = None
    """Secret Manager secret holding the engine's API key, when the inference block has an
    api_key (the node reads it at boot; the key never goes into metadata)."""

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            gone = [f"{k}: {why}" for k, why in _REMOVED.items() if k in data]
            if gone:
                raise ValueError("field(s) no longer exist — " + "; ".join(gone))
        return data

    @field_validator("model_path", "project_dir", "hf_home")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"must be an absolute path on the node (got {v!r})")
        return v.rstrip("/") or "/"

    @field_validator("tokenizer")
    @classmethod
    def _local_tokenizer(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(
                f"{v!r} is not an absolute folder on the node — the node boots offline "
                "(HF_HUB_OFFLINE=1), so a hub id cannot be downloaded there: put the "
                "tokenizer folder on the node image (docs/operator-gcp.md, section 3) and set "
                "tokenizer to its absolute path, e.g. \"/opt/models/Olmo-3-32B-Think\"")
        return v.rstrip("/") or "/"

    @field_validator("extra_args")
    @classmethod
    def _not_the_kv_shape(cls, v: list[str]) -> list[str]:
        cache = [a for a in v if a.split("=", 1)[0] in HOST_CACHE_FLAGS]
        if cache:
            raise ValueError(
                f"{cache}: these size llama-server's host-RAM caches, which the host-memory "
                "estimate (tasks/compute/host_memory.py) sizes from [compute.node] "
                "ctx_checkpoints, cache_ram_mib and cache_idle_slots — set those instead")
        bad = [a for a in v if a.split("=", 1)[0] in KV_SHAPE_FLAGS]
        if bad:
            raise ValueError(
                f"{bad}: these change the KV cache llama-server allocates, which the slot "
                "estimate (tasks/compute/kv_budget.py) sizes from one shape — remove them; "
                "slots and context come from [inference] max_concurrent_requests and "
                "context_tokens, the cache type from kv_cache_type")
        return v

    @field_validator("chat_template_file")
    @classmethod
    def _template_file(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        if v != v.strip() or "\n" in v or ".." in v.split("/"):
            raise ValueError(f"{v!r}: a path without surrounding blanks or `..` — relative "
                             f"to the node's checkout (e.g. {SHIPPED_TEMPLATE!r}), absolute on "
                             "the node, or empty for the GGUF's own template")
        return v

    @field_validator("service_user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not v or v == "root" or not all(c.isalnum() or c in "-_" for c in v):
            raise ValueError(f"{v!r}: a plain unix user name other than root, e.g. \"slm\"")
        return v

    def venv_bin(self, name: str) -> str:
        """An executable of the node's one environment."""
        return f"{self.project_dir}/.venv/bin/{name}"
