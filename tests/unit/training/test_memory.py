"""Parameter counts and verification memory estimates from config.json alone.

Expected values are worked out here by hand from each config (the arithmetic is written out),
and the count is checked against transformers' own models (`sum(p.numel())`, built on the meta
device, so nothing is allocated)."""

from __future__ import annotations

from typing import Any

import pytest

from tasks.shared.errors import ConfigError
from tasks.training import memory
from tasks.training.memory import G2_STANDARD_4, GIB, MIB, check_fit, estimate, param_count
from tasks.training.params import RECIPE_DIR

# SmolLM2-135M-Instruct's config.json (as hf_from_gguf writes it): llama, GQA 9/3, tied.
SMOLLM2 = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 49152,
           "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
           "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
           "dtype": "float32"}
OLMO3_7B = memory.load_config(RECIPE_DIR / "models" / "olmo-3-7b-think.config.json")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_smollm2_has_134_515_008_parameters() -> None:
    embed = 49152 * 576
    attn = 576 * 576 + 576 * 192 + 576 * 192 + 576 * 576  # q, k and v (3 KV heads × 64), o
    mlp = 3 * 576 * 1536
    norms = 2 * 576  # input and post-attention
    p = param_count(SMOLLM2)
    assert (p.embeddings, p.lm_head, p.attention, p.mlp, p.norms) == (
        embed, 0, 30 * attn, 30 * mlp, 30 * norms + 576)
    assert p.total == 134_515_008  # SmolLM2-135M's published count


def test_olmo3_7b_has_7_298_011_136_parameters() -> None:
    embed = 100278 * 4096
    attn = 4 * 4096 * 4096  # 32 query and 32 KV heads of 128
    mlp = 3 * 4096 * 11008
    norms = 4096 + 4096 + 4096 + 4096  # post-attention, post-feedforward, q_norm, k_norm
    p = param_count(OLMO3_7B)
    assert (p.embeddings, p.lm_head) == (embed, embed)  # untied lm_head
    assert (p.attention, p.mlp, p.norms) == (32 * attn, 32 * mlp, 32 * norms + 4096)
    assert p.total == 2 * 410_738_688 + 32 * 202_391_552 + 4096 == 7_298_011_136


def _built(config_cls: Any, **kw: Any) -> tuple[dict[str, Any], int]:
    import torch
    from transformers import AutoModelForCausalLM

    cfg = config_cls(**kw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return cfg.to_dict(), sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("case", ["olmo3-gqa", "olmo3-tied", "llama-biases-head-dim",
                                  "olmo2", "mistral"])
def test_the_count_is_transformers_own(case: str) -> None:
    from transformers import LlamaConfig, MistralConfig, Olmo2Config, Olmo3Config

    small = dict(vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2)
    config, numel = {
        "olmo3-gqa": lambda: _built(Olmo3Config, **small),
        "olmo3-tied": lambda: _built(Olmo3Config, **small, tie_word_embeddings=True,
                                     attention_bias=True),
        "llama-biases-head-dim": lambda: _built(LlamaConfig, **small, head_dim=24,
                                                attention_bias=True, mlp_bias=True,
                                                tie_word_embeddings=False),
        "olmo2": lambda: _built(Olmo2Config, **small),
        "mistral": lambda: _built(MistralConfig, **small, head_dim=8),
    }[case]()
    assert param_count(config).total == numel


def test_an_unknown_architecture_is_named() -> None:
    with pytest.raises(ConfigError, match="model_type 'gpt2'"):
        param_count({"model_type": "gpt2"})


def test_lora_r16_on_every_projection_of_the_7b() -> None:
    # per layer: q, k, v, o 16 × (4096 + 4096); gate, up, down 16 × (4096 + 11008)
    per_layer = 4 * 16 * 8192 + 3 * 16 * 15104
    assert memory.lora_param_count(OLMO3_7B, 16, TARGETS) == 32 * per_layer == 39_976_960


def test_the_cpu_plan_for_the_7b_needs_31_gib_of_ram() -> None:
    weights = 7_298_011_136 * 4
    lora = 39_976_960 * 4
    kv = 2 * 32 * 32 * 128 * 256 * 2  # K and V, 32 layers × 32 heads × 128, 256 tokens, f16
    compute = 256 * 4 * (100278 + 4 * 11008 + 4 * 4096 + 32 * 256)
    llama = weights + lora + kv + compute  # bigger than HF's weights + lora + 128 MiB
    est = estimate(OLMO3_7B, "cpu")
    assert est.ram == 3 * GIB + 672 * MIB + llama == 33_584_977_920
    assert est.vram == 0
    assert f"{est.ram / GIB:.1f}" == "31.3"
    # bf16 checkpoint → float32: the HF phase reads its 2 bytes a parameter once on top
    assert est.peak_rss == 672 * MIB + weights + lora + 128 * MIB + 7_298_011_136 * 2


def test_the_cuda_plan_for_the_7b_fits_an_l4_and_16_gib() -> None:
    weights = 7_298_011_136 * 2
    lora = 39_976_960 * 4
    hf = int((weights + lora) * 1.05) + 256 * 100278 * 4  # bf16 + slack, logits
    est = estimate(OLMO3_7B, "cuda")
    assert est.vram == 1 * GIB + hf
    host_embd = 410_738_688 * 2  # token_embd stays on the host in llama.cpp
    assert est.ram == 3 * GIB + 672 * MIB + 2 * GIB + host_embd
    assert est.ram < 16 * GIB and est.vram < 23034 * MIB
    check_fit(est, G2_STANDARD_4)  # does not raise


def test_a_plan_that_does_not_fit_is_refused_with_both_numbers() -> None:
    est = estimate(OLMO3_7B, "cpu")
    with pytest.raises(ConfigError) as e:
        check_fit(est, G2_STANDARD_4, fix="set verify_device: cuda")
    msg = str(e.value)
    assert "RAM 31.3 GiB > 16.0 GiB" in msg and "g2-standard-4" in msg
    assert "weights_f32 27.2 GiB" in msg and msg.endswith("set verify_device: cuda")
    small_gpu = memory.NodeLimits(ram=64 * GIB, vram=12 * GIB, source="a 12 GiB card")
    with pytest.raises(ConfigError, match=r"GPU memory 15\.5 GiB > 12\.0 GiB \(a 12 GiB card\)"):
        check_fit(estimate(OLMO3_7B, "cuda"), small_gpu)
