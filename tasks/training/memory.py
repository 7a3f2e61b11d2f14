"""How many parameters a model has and how much memory verifying an adapter on it takes, from its
config.json alone — before a weight loads.

The parameter count is exact for the shapes it knows (llama/mistral, olmo2/olmo3): embeddings, an
untied lm_head, attention with grouped KV heads and an explicit head_dim, the MLP, every norm
(OLMo's q/k norms included). Memory estimates follow the verification child
(tasks/training/verify.py), which runs its engines one after the other and closes each:

- plan `cpu` (F32 GGUF in llama.cpp, then HF in float32, on the CPU): the weights sit in RAM
  in float32 once per engine phase;
- plan `cuda` (F16/BF16 GGUF with every layer on the GPU, then HF in bfloat16 on the GPU): the
  weights sit on the GPU; RAM holds the runtimes, llama.cpp's token embeddings (it keeps the
  input embedding on the host) and, while HF loads, the checkpoint's pages read once.

Every constant below says where it comes from: "measured" ones are from runs here (CPU, SmolLM2
and a tiny OLMo 3, 2026-11); "estimate" ones have not been measured on a GPU yet —
bench/verify_7b.py prints the measured figures beside these estimates on one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.shared.errors import ConfigError

MIB = 2**20
GIB = 2**30

# Architectures whose parameter count this module computes exactly (transformers model_type).
KNOWN_TYPES = ("llama", "mistral", "olmo2", "olmo3")
DTYPE_BYTES = {"float32": 4, "f32": 4, "float16": 2, "f16": 2, "bfloat16": 2, "bf16": 2}

# Measured: the verification child's RSS once torch, transformers, llama_cpp and the tokenizer
# are loaded (SmolLM2: 658 MiB peak at the end of the "tokenize" stage with PyPI's default
# torch 2.13.0 build, +cu130, which the machines and the node install; 362 MiB with the CPU-only
# build the older development machines had — the CUDA libraries alone are ~300 MiB resident).
RUNTIME_RAM = 672 * MIB
# Measured: what the HF phase holds beyond the weights (peft's import, the adapter, generation):
# SmolLM2 float32, 997 MiB peak − 362 runtime − 514 weights = 121 MiB.
HF_EXTRA_RAM = 128 * MIB
# Estimate: host memory the CUDA runtime adds to a process with torch and llama.cpp's CUDA
# backend both initialised (driver, context, cuBLAS and ggml-cuda kernels).
CUDA_HOST_RAM = 2 * GIB
# Estimate: GPU memory of the two CUDA contexts (torch's, llama.cpp's) and their workspaces.
CUDA_CONTEXT_VRAM = 1 * GIB
# Estimate: beside the child, the flow process that spawned it (Prefect, torch and, on a GPU
# node, its CUDA context from training) and the operating system.
NODE_RESERVE_RAM = 3 * GIB
# Estimate: the caching allocator's slack over the tensors it holds.
ALLOCATOR_SLACK = 0.05

# The verification child's context: prompts of the chat template plus max_tokens (verify.py).
VERIFY_CONTEXT_TOKENS = 256


@dataclass(frozen=True)
class ParamCount:
    """Parameters by part; `total` is what `sum(p.numel() for p in model.parameters())` gives."""

    embeddings: int
    lm_head: int  # 0 when tied to the embeddings
    attention: int  # q, k, v, o (and their biases) over all layers
    mlp: int  # gate, up, down over all layers
    norms: int  # every RMSNorm weight, the final norm included
    layers: int
    hidden: int
    vocab: int

    @property
    def total(self) -> int:
        return self.embeddings + self.lm_head + self.attention + self.mlp + self.norms


def load_config(path: Path | str) -> dict[str, Any]:
    """A config.json (or the folder that holds one) as a dict."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"model config {p}: not found — pass a Hugging Face model folder or "
                          "its config.json (recipes/models/ holds the production model's)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ConfigError(f"model config {p}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"model config {p}: expected a JSON object")
    return data


def _shape(config: dict[str, Any]) -> dict[str, int]:
    model_type = config.get("model_type")
    if model_type not in KNOWN_TYPES:
        raise ConfigError(f"model config: model_type {model_type!r} — memory estimates know "
                          f"{list(KNOWN_TYPES)}; add its shape to tasks/training/memory.py")
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        return {"hidden": hidden, "heads": heads,
                "kv": int(config.get("num_key_value_heads") or heads),
                "head_dim": int(config.get("head_dim") or hidden // heads),
                "inter": int(config["intermediate_size"]),
                "layers": int(config["num_hidden_layers"]),
                "vocab": int(config["vocab_size"])}
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"model config ({model_type}): {e!r} missing or not a number — is this "
                          "a complete config.json?") from e


def param_count(config: dict[str, Any]) -> ParamCount:
    """Exact parameter count of a llama/mistral/olmo2/olmo3 model from its config."""
    s = _shape(config)
    h, hd, layers = s["hidden"], s["head_dim"], s["layers"]
    q_out, kv_out = s["heads"] * hd, s["kv"] * hd
    attn = h * q_out + 2 * h * kv_out + q_out * h
    if config.get("attention_bias"):  # q, k, v and o all get a bias (llama and olmo alike)
        attn += q_out + 2 * kv_out + h
    mlp = 3 * h * s["inter"]
    if config.get("mlp_bias"):  # llama only; OLMo's MLP has no bias
        mlp += 2 * s["inter"] + h
    if config["model_type"] in ("olmo2", "olmo3"):
        # post-attention and post-feedforward norms, and q/k norms over all heads together
        norms = 2 * h + q_out + kv_out
    else:  # input and post-attention norms
        norms = 2 * h
    embeddings = s["vocab"] * h
    tied = bool(config.get("tie_word_embeddings", False))
    return ParamCount(embeddings=embeddings, lm_head=0 if tied else embeddings,
                      attention=layers * attn, mlp=layers * mlp, norms=layers * norms + h,
                      layers=layers, hidden=h, vocab=s["vocab"])


def lora_param_count(config: dict[str, Any], r: int, target_modules: list[str]) -> int:
    """Parameters of a LoRA of rank r on the named projections (r × (in + out) each)."""
    s = _shape(config)
    h, q_out, kv_out, inter = s["hidden"], s["heads"] * s["head_dim"], s["kv"] * s["head_dim"], \
        s["inter"]
    shapes = {"q_proj": (h, q_out), "k_proj": (h, kv_out), "v_proj": (h, kv_out),
              "o_proj": (q_out, h), "gate_proj": (h, inter), "up_proj": (h, inter),
              "down_proj": (inter, h)}
    return s["layers"] * sum(r * sum(shapes[t]) for t in target_modules if t in shapes)


@dataclass(frozen=True)
class Estimate:
    """Peak memory of one verification plan. `ram` must fit the node's RAM (the child's
    resident memory plus what runs beside it); `vram` the GPU. `peak_rss` is what the child's
    own peak RSS should read: it adds checkpoint pages read once while HF loads, which the
    kernel can drop, so they do not count against the node."""

    plan: str
    ram: int
    vram: int
    peak_rss: int
    parts: dict[str, int] = field(default_factory=dict)  # what each figure is made of, bytes

    def describe(self) -> str:
        reserve = self.parts.get("node_reserve", 0)
        return (f"plan {self.plan}: RAM {gib(self.ram)} (the child {gib(self.ram - reserve)} + "
                f"{gib(reserve)} beside it), GPU {gib(self.vram)}")


def gib(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB"


def estimate(config: dict[str, Any], plan: str, *, lora_r: int = 16,
             target_modules: list[str] | None = None, checkpoint_dtype: str | None = None,
             context_tokens: int = VERIFY_CONTEXT_TOKENS) -> Estimate:
    """Peak RAM / VRAM of verifying a LoRA on this model with one plan ("cpu" or "cuda").

    `checkpoint_dtype`: the dtype the HF folder stores its weights in (config `dtype` /
    `torch_dtype` when not given); when it is the load dtype, transformers maps the file and
    uses it in place, otherwise it reads it once into new tensors.
    """
    if plan not in ("cpu", "cuda"):
        raise ConfigError(f"verification plan {plan!r}: not one of cpu, cuda")
    p = param_count(config)
    s = _shape(config)
    targets = target_modules or ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                 "up_proj", "down_proj"]
    lora = lora_param_count(config, lora_r, targets) * 4  # adapters are exported in float32
    stored = str(checkpoint_dtype or config.get("dtype") or config.get("torch_dtype")
                 or "float32")
    stored_bytes = DTYPE_BYTES.get(stored, 4)
    # llama.cpp's context: an F16 KV cache, and a compute buffer sized for a batch of the whole
    # context (the child decodes prompts with n_batch = n_ctx): logits, FFN and attention rows.
    kv = 2 * s["layers"] * s["kv"] * s["head_dim"] * context_tokens * 2
    compute = context_tokens * 4 * (s["vocab"] + 4 * s["inter"] + 4 * s["hidden"]
                                    + s["heads"] * context_tokens)
    llama_ctx = kv + compute
    if plan == "cpu":
        weights = p.total * 4  # the F32 GGUF; HF float32 holds the same bytes
        llama_phase = weights + lora + llama_ctx
        hf_phase = weights + lora + HF_EXTRA_RAM
        read_once = 0 if stored_bytes == 4 else p.total * stored_bytes
        child = RUNTIME_RAM + max(llama_phase, hf_phase)
        peak_rss = RUNTIME_RAM + max(llama_phase, hf_phase + read_once)
        parts = {"runtime": RUNTIME_RAM, "weights_f32": weights, "lora": lora,
                 "llama_context": llama_ctx, "hf_extra": HF_EXTRA_RAM,
                 "checkpoint_read_once": read_once, "node_reserve": NODE_RESERVE_RAM}
        return Estimate("cpu", ram=child + NODE_RESERVE_RAM, vram=0, peak_rss=peak_rss,
                        parts=parts)
    weights = p.total * 2  # F16/BF16 GGUF and HF in bfloat16 alike
    host_embd = p.embeddings * 2  # llama.cpp keeps token_embd on the host even with -ngl -1
    llama_gpu = weights - host_embd + lora + llama_ctx
    hf_gpu = int((weights + lora) * (1 + ALLOCATOR_SLACK)) + context_tokens * s["vocab"] * 4
    vram = CUDA_CONTEXT_VRAM + max(llama_gpu, hf_gpu)
    host = RUNTIME_RAM + CUDA_HOST_RAM + max(host_embd, HF_EXTRA_RAM)
    read_once = p.total * stored_bytes  # HF reads the checkpoint through the host once
    parts = {"runtime": RUNTIME_RAM, "cuda_host": CUDA_HOST_RAM, "llama_host_embeddings": host_embd,
             "hf_extra": HF_EXTRA_RAM, "weights_16bit": weights, "lora": lora,
             "llama_context": llama_ctx, "cuda_contexts": CUDA_CONTEXT_VRAM,
             "checkpoint_read_once": read_once, "node_reserve": NODE_RESERVE_RAM}
    return Estimate("cuda", ram=host + NODE_RESERVE_RAM, vram=vram,
                    peak_rss=RUNTIME_RAM + CUDA_HOST_RAM + max(host_embd, HF_EXTRA_RAM + read_once),
                    parts=parts)


@dataclass(frozen=True)
class NodeLimits:
    """Memory of the machine that trains and verifies, and where the figures come from."""

    ram: int
    vram: int
    source: str


# A g2-standard-4: 16 GB of RAM (Compute Engine's GB are GiB) and one NVIDIA L4, whose 24 GB
# CUDA reports as 23,034 MiB.
G2_STANDARD_4 = NodeLimits(ram=16 * GIB, vram=23034 * MIB, source="g2-standard-4 (16 GiB RAM, "
                           "NVIDIA L4 23034 MiB)")


def check_fit(est: Estimate, limits: NodeLimits, *, fix: str = "") -> None:
    """Raise ConfigError naming the estimate, the limit and the fix when the plan does not fit."""
    over = []
    if est.ram > limits.ram:
        over.append(f"RAM {gib(est.ram)} > {gib(limits.ram)}")
    if est.vram > limits.vram:
        over.append(f"GPU memory {gib(est.vram)} > {gib(limits.vram)}")
    if over:
        raise ConfigError(
            f"verification plan {est.plan} does not fit the node: estimated "
            f"{' and '.join(over)} ({limits.source}); the estimate: "
            + ", ".join(f"{k} {gib(v)}" for k, v in est.parts.items() if v)
            + f" — {fix or 'use a plan that fits (verify_device) or a bigger node'}")
