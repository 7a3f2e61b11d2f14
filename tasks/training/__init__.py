"""QLoRA training, the base model, GGUF export, verification, the adapter registry."""
