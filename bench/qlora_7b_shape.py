"""QLoRA at OLMo 3 7B's shape on one CUDA GPU: does a night's training fit the L4's 24 GB?

Builds a randomly initialised model with OLMo 3 7B's shape (no download: the weights do not
matter for memory or speed), quantizes every decoder linear layer to NF4 as it is created (the
bf16 model never exists whole), adds LoRA r=16 on all projections, and runs a few optimizer
steps at sequence 2048 with gradient checkpointing — once packed (every token real) and once
padded (short examples padded to 2048, the no-packing baseline). Prints one JSON object:
peak GPU memory per mode (target ≤ 20 GiB) and tokens/s, packed vs padded.

    python bench/qlora_7b_shape.py [--steps 6] [--seq 2048]

Needs a CUDA GPU and bitsandbytes; on a machine without one it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def build(seq: int):  # noqa: ANN201 - torch types only exist when torch imports
    import bitsandbytes as bnb
    import torch
    from peft import get_peft_model
    from transformers import Olmo3Config, Olmo3ForCausalLM

    from tasks.training.params import TrainParams, resolve

    cfg = Olmo3Config(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=100278,
                      max_position_embeddings=max(seq, 4096))
    # Random bf16 weights on the CPU (~14 GB of host memory), then each decoder linear layer is
    # quantized to NF4 as it moves to the GPU: the bf16 model never sits on the card.
    torch.set_default_dtype(torch.bfloat16)
    model = Olmo3ForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    dev = torch.device("cuda")

    def quantized(lin: torch.nn.Linear) -> torch.nn.Module:
        q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                              compute_dtype=torch.bfloat16, quant_type="nf4")
        q.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, quant_type="nf4")
        return q.to(dev)

    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(parent, name, quantized(child))
    model.to(dev)  # embeddings, norms, head: bf16
    for p in model.parameters():
        p.requires_grad_(False)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    # The production recipe's LoRA (recipes/production.yaml, peft:), as the node trains it.
    lora = resolve(TrainParams(dataset="", method="sft", recipe="production")).lora_config()
    return get_peft_model(model, lora), cfg


def run(model, cfg, seq: int, steps: int, packed: bool) -> dict:  # noqa: ANN001
    import torch

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    real = 0
    t0 = None
    for step in range(steps + 1):  # step 0 warms up (kernels, allocator) and is not timed
        if step == 1:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            real = 0
        ids = torch.randint(0, cfg.vocab_size, (1, seq), device="cuda")
        if packed:  # every position is a real token (several examples back to back)
            mask = torch.ones_like(ids)
        else:  # one ~600-token example padded to the full length, as without packing
            mask = torch.zeros_like(ids)
            mask[:, :600] = 1
        labels = ids.masked_fill(mask == 0, -100)
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        real += int(mask.sum())
    torch.cuda.synchronize()
    seconds = time.perf_counter() - (t0 or time.perf_counter())
    return {"peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "tokens_per_s": round(real / seconds, 1), "seconds": round(seconds, 2),
            "steps": steps}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq", type=int, default=2048)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"bench": "qlora_7b_shape", "skipped": "no CUDA GPU on this machine"}))
        return 77  # SKIP (bench/_common.py): bench/run_all.py counts it skipped, not failed
    t = time.perf_counter()
    model, cfg = build(args.seq)
    built = round(time.perf_counter() - t, 1)
    packed = run(model, cfg, args.seq, args.steps, packed=True)
    padded = run(model, cfg, args.seq, args.steps, packed=False)
    print(json.dumps({
        "bench": "qlora_7b_shape", "gpu": torch.cuda.get_device_name(), "seq": args.seq,
        "build_s": built, "packed": packed, "padded": padded,
        "real_tokens_per_s_packed_over_padded": round(packed["tokens_per_s"] /
                                                      max(padded["tokens_per_s"], 1e-9), 2),
        "target": {"peak_gib": "<= 20 (L4: 24 GB)"},
        "fits_l4": max(packed["peak_gib"], padded["peak_gib"]) <= 20}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
