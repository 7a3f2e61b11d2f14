"""Will the node's slots fit the card? An estimate, from the model's shape and the KV cache
type, of what llama-server allocates on the GPU: the weights, the KV cache of every slot, and
the compute buffers. Preflight refuses a slot setting that does not fit, naming both numbers;
nothing falls back to fewer slots or a smaller context silently.

How llama.cpp sizes the KV cache (the vendored src/llama-kv-cache.cpp and
llama-kv-cache-iswa.cpp): per layer and token, K and V of n_kv_heads x head_dim elements each,
at the cache type's size (f16: 2 bytes; q8_0: 34 bytes per block of 32). `-c` is the whole
cache, `-np` slots share it evenly. A model with sliding-window layers gets a second, small
cache for them: the window plus one micro-batch per slot, not the whole context (unless
--swa-full). OLMo 3 32B (its model card): 64 layers, 8 KV heads of 128, 48 of them
sliding-window at 4096 — 256 KiB of f16 KV per token, ~1.4 GiB per 8192-token slot with the
sliding-window cache (~0.7 GiB at q8_0).

The compute buffers and the CUDA context are a fixed allowance (OVERHEAD_GIB), not measured:
the figure is an estimate, and says so. The first night on a GPU confirms it
(bench/gpu_node_check.py prints what the server reports).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GIB = 1024**3
# bytes per KV element by cache type (ggml type sizes: q8_0 = 34-byte blocks of 32, q4_0 = 18)
KV_BYTES = {"f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
UBATCH = 512  # llama-server's default micro-batch: the sliding-window cache holds one extra
# Both caches are padded to 256 cells (llama-context.cpp: n_ctx_seq = GGML_PAD(n_ctx / n_seq_max,
# 256); llama-kv-cache-iswa.cpp: size_swa = GGML_PAD(min(size_base, n_swa + n_ubatch), 256))
PAD = 256
OVERHEAD_GIB = 1.2  # CUDA context + compute buffers of a 32B model at ubatch 512 (estimate)


@dataclass(frozen=True)
class ModelShape:
    """The model's attention, what its KV cache is sized from: transformer layers, KV heads per
    layer, the head dimension, and the layers with sliding-window attention and their window in
    tokens (0: none). The host-RAM estimate (tasks/compute/host_memory.py) reads it too."""

    layers: int
    kv_heads: int
    head_dim: int
    sliding_layers: int = 0
    sliding_window: int = 0

    @classmethod
    def of_node(cls, s: Any) -> ModelShape:
        """From a node's settings (blocks/node_serve.py NodeServeSettings, its model_* keys)."""
        return cls(layers=s.model_layers, kv_heads=s.model_kv_heads, head_dim=s.model_head_dim,
                   sliding_layers=s.model_sliding_layers,
                   sliding_window=s.model_sliding_window)


@dataclass(frozen=True)
class Card:
    """The node's GPU and what it holds beside the KV cache: the memory llama.cpp can use, the
    weights, and the CUDA context with the compute buffers (an allowance, OVERHEAD_GIB)."""

    gib: float
    weights_gib: float
    overhead_gib: float = OVERHEAD_GIB

    @classmethod
    def of_node(cls, s: Any) -> Card:
        """From a node's settings (gpu_memory_gib, model_weights_gib)."""
        return cls(gib=s.gpu_memory_gib, weights_gib=s.model_weights_gib)


@dataclass(frozen=True)
class KvFit:
    slots: int
    context_tokens: int
    kv_gib: float  # the KV cache of all slots
    weights_gib: float
    overhead_gib: float
    card_gib: float

    @property
    def needed_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.overhead_gib

    @property
    def fits(self) -> bool:
        return self.needed_gib <= self.card_gib

    def text(self) -> str:
        return (f"{self.slots} slots x {self.context_tokens} tokens: KV {self.kv_gib:.2f} GiB + "
                f"weights {self.weights_gib:.2f} GiB + {self.overhead_gib:.1f} GiB buffers = "
                f"{self.needed_gib:.2f} GiB of the card's {self.card_gib:.1f} GiB (estimate)")


def row_bytes(kv_heads: int, head_dim: int, cache_type: str) -> float:
    """One K (or V) row of one layer and one token: n_kv_heads x head_dim at the cache type."""
    if cache_type not in KV_BYTES:
        raise ValueError(f"KV cache type {cache_type!r}: use one of {', '.join(KV_BYTES)}")
    return kv_heads * head_dim * KV_BYTES[cache_type]


def kv_bytes_per_slot(context_tokens: int, shape: ModelShape, cache_type: str = "f16",
                      swa_full: bool = False) -> float:
    """KV cache bytes of one slot of `context_tokens`."""
    per_layer_token = 2 * row_bytes(shape.kv_heads, shape.head_dim, cache_type)
    full = shape.layers - shape.sliding_layers
    context = _pad(context_tokens)
    swa_tokens = context if swa_full or not shape.sliding_window else \
        _pad(min(context, shape.sliding_window + UBATCH))
    return per_layer_token * (full * context + shape.sliding_layers * swa_tokens)


def _pad(cells: int) -> int:
    return -(-cells // PAD) * PAD


def kv_fit(slots: int, context_tokens: int, shape: ModelShape, card: Card,
           cache_type: str = "f16") -> KvFit:
    per_slot = kv_bytes_per_slot(context_tokens, shape, cache_type)
    return KvFit(slots, context_tokens, slots * per_slot / GIB, card.weights_gib,
                 card.overhead_gib, card.gib)


def largest(fits: Callable[[int], bool], start: int = 1, limit: int = 1024) -> int:
    """The largest n (start ≤ n ≤ limit) that fits, counting up from `start`; start - 1 when
    not even `start` fits."""
    n = start - 1
    while n < limit and fits(n + 1):
        n += 1
    return n


def largest_fit(context_tokens: int, shape: ModelShape, card: Card,
                cache_type: str = "f16") -> int:
    """The most slots of `context_tokens` that fit (0: not even one)."""
    return largest(lambda n: kv_fit(n, context_tokens, shape, card, cache_type).fits)
