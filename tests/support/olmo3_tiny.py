"""A tiny, randomly initialised OLMo 3: the production model's architecture at toy size.

transformers' own `Olmo3Config` with small sizes — 4 layers, so `layer_types` holds OLMo 3's
pattern (3 sliding-window layers, then a full-attention one), grouped-query attention, YaRN rope
on the full-attention layers, the q/k norms and post-norms of the architecture — and SmolLM2's
tokenizer (offline, with a chat template). The sliding window (8) is shorter than the
verification prompts (SmolLM2's chat template alone is ~30 tokens), so llama.cpp and
transformers must agree on which tokens a sliding layer sees (measured: a window of 7 or 9 on
the HF side moves the logits by 4-5). Its base GGUF is written by llama.cpp's own converter
(tasks.training.convert).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LAYERS = 4
LAYER_TYPES = ["sliding_attention"] * 3 + ["full_attention"]
SLIDING_WINDOW = 8
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
# OLMo 3 7B's long-context rope: YaRN on the full-attention layers only (llama.cpp's olmo2 graph
# gives sliding layers plain rope); it changes the tiny model's logits by ~0.45, so a converter
# or runtime that dropped it would fail verification.
ROPE = {"full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0,
                           "original_max_position_embeddings": 8192, "beta_fast": 32.0,
                           "beta_slow": 1.0, "attention_factor": 1.2079441541679836},
        "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SEED = 0


def build(out: Path, tokenizer_gguf: Path) -> dict[str, Any]:
    """Write the HF folder to `out` (weights, config, tokenizer); return {"hf", "config"}."""
    import torch
    from transformers import AutoTokenizer, Olmo3Config, Olmo3ForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_gguf.parent, gguf_file=tokenizer_gguf.name,
                                        local_files_only=True)
    config = Olmo3Config(
        vocab_size=len(tok), hidden_size=HEADS * HEAD_DIM, intermediate_size=128,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        layer_types=LAYER_TYPES, sliding_window=SLIDING_WINDOW, rope_parameters=ROPE,
        max_position_embeddings=65536,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        # Wide enough that logits are spread (a 0.02 init leaves 49k near-ties for greedy).
        initializer_range=0.2)
    torch.manual_seed(SEED)
    model = Olmo3ForCausalLM(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    return {"hf": out, "config": config.to_dict()}
