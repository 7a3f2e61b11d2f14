"""Will llama-server's slots fit the node's host RAM? An estimate, from the model's shape, the
KV cache type and the host-cache settings, of what llama-server holds in the node's RAM beside
the Prefect worker and the OS. Preflight refuses a setting that does not fit, naming both
numbers (tasks/preflight/node.py); the card's side is tasks/compute/kv_budget.py.

What llama-server keeps in host RAM (the vendored llama.cpp of llama-cpp-python 0.3.36):

- Context checkpoints, per slot (tools/server/server-context.cpp `create_checkpoint`): a copy
  of the slot's sliding-window (SWA) cache, `llama_state_seq_get_data_ext(...,
  LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)` — src/llama-kv-cache-iswa.cpp `state_write` writes
  only `kv_swa` with that flag. At most `--ctx-checkpoints` of them per slot (common/common.h
  `n_ctx_checkpoints`, default 32; the oldest is erased beyond it). `--cache-ram` does not
  bound them: they live in the slot (`slot.prompt.checkpoints`), not in the prompt cache.
  One checkpoint is the SWA cells of the sequence that are not masked
  (src/llama-kv-cache.cpp `state_write`: at most the window, n_swa cells), each cell its
  position, seq-id count and seq id (`state_write_meta`: 12 bytes) and, per sliding layer, a
  K and a V row (`state_write_data`: n_kv_heads x head_dim at the cache type's size). OLMo 3
  32B at q8_0: 48 x 2 x 1088 + 12 = 104,460 bytes per cell, 0.40 GiB for a full 4096-token
  window; at f16 0.75 GiB.
  How many a request makes (server-context.cpp `update_slots`): one at the start of the last
  user message (the system prompt before it) and two near the end of the prompt (4 + n_ubatch
  and 4 tokens before it, `checkpoint_offsets`). The next request's distinct chunk erases
  the two near the end (`pos_max > pos_next`) and restores the first: the system prompt is
  not computed again. Three per slot keep that one; with two, the third checkpoint of a
  request evicts it (the oldest goes first), and nothing is reused by a distinct chunk.
- The prompt cache (`--cache-ram` MiB; common/common.h `cache_ram_mib`, default 8192, 0
  disables it): whole slot states, kept for a later prompt with a longer common prefix.
  tools/server/server-task.cpp `server_prompt_cache::alloc` evicts the oldest entries to stay
  under the limit, checkpoints copied with an entry included. Idle-slot saves
  (`--cache-idle-slots`, default on; server-context.cpp `process_single_task`) go into that
  cache, so they are inside its bound — and off without it (`init`: "--cache-idle-slots
  requires --cache-ram, disabling"). One save is the slot's whole state: its full-attention
  KV of the context, its SWA window and its checkpoints (~0.7 GB for an 8192-token OLMo 3
  slot at q8_0).
- The engine itself with every layer on the GPU (an ESTIMATE, ENGINE_GIB): the CUDA runtime,
  cuBLAS and ggml-cuda's kernels in the process, and the token-embedding table, which
  llama.cpp keeps on the CPU whatever -ngl says (src/llama-model.cpp `load_tensors`:
  `dev_input = { cpu_dev, ... }`): 100,278 x 5120 for OLMo 3 32B, 0.21 GiB at Q3_K, 0.40 at
  Q6_K.

Beside it: the Prefect worker and the flow run it starts (WORKER_GIB), and the OS (OS_GIB).
The page cache of the GGUF it read is reclaimable and not counted. bench/gpu_node_check.py
logs the server's VmRSS/VmHWM, which confirms or corrects the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tasks.compute.kv_budget import GIB, ModelShape, largest, row_bytes

MIB = 1024**2
# Per SWA cell, the metadata a checkpoint writes before the rows (src/llama-kv-cache.cpp
# state_write_meta: llama_pos pos, uint32 n_seq_id, one llama_seq_id).
CELL_META_BYTES = 12
# Estimate: llama-server's own RSS with every layer on the GPU and no checkpoints or cache —
# the CUDA runtime, cuBLAS and the ggml-cuda kernels (~1 GiB: tasks/training/memory.py puts
# torch's and llama.cpp's together at 2 GiB), the token embeddings on the CPU (0.2-0.4 GiB),
# the vocabulary, the HTTP server and the compute/output host buffers.
ENGINE_GIB = 1.5
# Estimate: the node's Prefect worker (a Python process with Prefect imported, ~0.4 GiB) and a
# flow run it starts while the engine still serves — `python -m prefect.engine` with Prefect
# and torch imported (tasks/training/memory.py RUNTIME_RAM, measured: 672 MiB with the +cu130
# torch) before it stops the engine to train (docs/operator-gcp.md: the night stops the engine,
# then trains).
WORKER_GIB = 1.5
# Estimate: what the guest does not get and the OS keeps: the kernel's own reservation (a
# machine type's RAM shows ~2 % lower as MemTotal: a 15 GB machine reported 15,406,128 kB,
# 14.69 GiB, gist.github.com/mainyaa/0e5d56871a71393c6029550e98761fcc — so a g2-standard-4
# about 15.7 GiB), systemd, sshd, the guest agent and the ops agent.
OS_GIB = 1.0
# A g2-standard-4's memory: 16 GB, and Compute Engine's GB are GiB ("machine type memory ... [is]
# calculated in gigabytes (GB), where 1 GB is 2^30 bytes", cloud.google.com/compute/
# vm-instance-pricing; tasks/training/memory.py G2_STANDARD_4). The guest's MemTotal is a little
# lower (about 15.6 GiB): OS_GIB covers the difference.
G2_STANDARD_4_GIB = 16.0


def checkpoint_bytes(context_tokens: int, shape: ModelShape, cache_type: str) -> int:
    """The largest context checkpoint of one slot: its sliding-window cells (the window, or
    the whole context when shorter), each with its metadata and a K and a V row per sliding
    layer. 0 for a model without sliding-window layers (llama-server makes none for it)."""
    if not shape.sliding_layers or not shape.sliding_window:
        return 0
    cells = min(context_tokens, shape.sliding_window)
    per_cell = CELL_META_BYTES + shape.sliding_layers * 2 * row_bytes(
        shape.kv_heads, shape.head_dim, cache_type)
    return int(cells * per_cell)


def slot_state_bytes(context_tokens: int, shape: ModelShape, cache_type: str) -> int:
    """One slot's whole state as an idle-slot save copies it (LLAMA_STATE_SEQ_FLAGS_NONE): the
    full-attention layers over the context, the sliding ones over their window."""
    row = row_bytes(shape.kv_heads, shape.head_dim, cache_type)
    full = (shape.layers - shape.sliding_layers) if shape.sliding_window else shape.layers
    swa = checkpoint_bytes(context_tokens, shape, cache_type)
    return int(context_tokens * (CELL_META_BYTES + full * 2 * row)) + swa


@dataclass(frozen=True)
class Host:
    """The node's RAM and llama-server's host caches on it: context checkpoints per slot
    (--ctx-checkpoints), the prompt cache's bound (--cache-ram, MiB; 0: none) and whether idle
    slots are saved into it (--cache-idle-slots); beside them the engine, the Prefect worker
    and the OS (estimates: ENGINE_GIB, WORKER_GIB, OS_GIB)."""

    gib: float
    ctx_checkpoints: int
    cache_ram_mib: int
    cache_idle_slots: bool
    engine_gib: float = ENGINE_GIB
    worker_gib: float = WORKER_GIB
    os_gib: float = OS_GIB

    @classmethod
    def of_node(cls, s: Any) -> Host:
        """From a node's settings (blocks/node_serve.py NodeServeSettings)."""
        return cls(gib=s.host_memory_gib, ctx_checkpoints=s.ctx_checkpoints,
                   cache_ram_mib=s.cache_ram_mib, cache_idle_slots=s.cache_idle_slots)


@dataclass(frozen=True)
class HostFit:
    slots: int
    context_tokens: int
    ctx_checkpoints: int  # per slot (--ctx-checkpoints)
    checkpoint_bytes: int  # the largest one
    cache_ram_mib: int  # the prompt cache's bound (--cache-ram); idle-slot saves inside it
    idle_save_bytes: int  # one idle-slot save, its checkpoints aside (0: off)
    engine_gib: float
    worker_gib: float
    os_gib: float
    host_gib: float

    @property
    def checkpoints_gib(self) -> float:
        return self.slots * self.ctx_checkpoints * self.checkpoint_bytes / GIB

    @property
    def prompt_cache_gib(self) -> float:
        return self.cache_ram_mib * MIB / GIB

    @property
    def needed_gib(self) -> float:
        return (self.checkpoints_gib + self.prompt_cache_gib + self.engine_gib
                + self.worker_gib + self.os_gib)

    @property
    def fits(self) -> bool:
        return self.needed_gib <= self.host_gib

    def text(self) -> str:
        idle = (f", idle-slot saves of {self.idle_save_bytes / GIB:.2f} GiB each and their "
                "checkpoints inside it"
                if self.idle_save_bytes else ", no idle-slot saves")
        return (f"{self.slots} slots x {self.ctx_checkpoints} context checkpoints of "
                f"{self.checkpoint_bytes / GIB:.2f} GiB = {self.checkpoints_gib:.2f} GiB + "
                f"prompt cache {self.prompt_cache_gib:.2f} GiB (--cache-ram "
                f"{self.cache_ram_mib}{idle}) + llama-server {self.engine_gib:.1f} GiB + "
                f"Prefect worker and flow run {self.worker_gib:.1f} GiB + OS "
                f"{self.os_gib:.1f} GiB = {self.needed_gib:.2f} GiB of the node's "
                f"{self.host_gib:.1f} GiB of RAM (estimate)")


def host_fit(slots: int, context_tokens: int, shape: ModelShape, cache_type: str,
             host: Host) -> HostFit:
    ckpt = checkpoint_bytes(context_tokens, shape, cache_type)
    # idle-slot saves need the prompt cache (server-context.cpp init disables them without)
    idle = slot_state_bytes(context_tokens, shape, cache_type) \
        if host.cache_idle_slots and host.cache_ram_mib else 0
    return HostFit(slots, context_tokens, host.ctx_checkpoints, ckpt, host.cache_ram_mib, idle,
                   host.engine_gib, host.worker_gib, host.os_gib, host.gib)


def most_checkpoints(slots: int, context_tokens: int, shape: ModelShape, cache_type: str,
                     host: Host) -> int:
    """The most context checkpoints per slot that fit (-1: not even none)."""
    def fits(n: int) -> bool:
        return host_fit(slots, context_tokens, shape, cache_type,
                        replace(host, ctx_checkpoints=n)).fits

    return largest(fits, start=0, limit=64)


def most_slots(context_tokens: int, shape: ModelShape, cache_type: str, host: Host) -> int:
    """The most slots that fit with these settings (0: not even one)."""
    return largest(lambda n: host_fit(n, context_tokens, shape, cache_type, host).fits)
