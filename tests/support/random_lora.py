"""A real PEFT LoRA with random lora_B (so it visibly changes the base's output) and its GGUF,
by llama.cpp's own converter: for tests that need an adapter but not a training run."""

from __future__ import annotations

from pathlib import Path

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def random_lora(hf_dir: Path, out: Path, seed: int = 0, scale: float = 0.05
                ) -> tuple[Path, Path]:
    """(PEFT folder, GGUF adapter) under `out`: r=8, alpha 16, every projection."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tasks.training.convert import export_lora

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                 local_files_only=True)
    # PEFT draws lora_A from torch's global generator: seeded too, or the adapter (and whether
    # it changes a short greedy answer) differs from run to run (a CI flake, 2026-12-04)
    torch.manual_seed(seed)
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS,
                                            task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    peft.save_pretrained(out / "peft")
    export_lora(out / "peft", hf_dir, out / "adapter.gguf", "f32")
    return out / "peft", out / "adapter.gguf"
