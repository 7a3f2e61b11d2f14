"""A tiny, randomly initialised OLMo 3: the production model's architecture at toy size.

transformers' own `Olmo3Config` with small sizes — 4 layers, so `layer_types` holds OLMo 3's
pattern (3 sliding-window layers, then a full-attention one), grouped-query attention, the
q/k norms and post-norms of the architecture — and SmolLM2's tokenizer (offline, with a chat
template). The sliding window is shorter than the verification prompts (SmolLM2's chat template
alone is ~30 tokens), so llama.cpp and transformers must agree on which tokens a sliding layer
sees. Its base GGUF is written by llama.cpp's own converter (tasks.training.convert).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LAYERS = 4
LAYER_TYPES = ["sliding_attention"] * 3 + ["full_attention"]
SLIDING_WINDOW = 8
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
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
        layer_types=LAYER_TYPES, sliding_window=SLIDING_WINDOW, max_position_embeddings=4096,
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
