"""The production architecture's path, on a tiny random OLMo 3 (tests/support/olmo3_tiny.py), on the CPU:
flows.train.train trains (float LoRA, and 4-bit QLoRA through bitsandbytes' CPU path), llama.cpp's own
convert_lora_to_gguf.py exports, verification compares llama.cpp (base GGUF from
convert_hf_to_gguf.py + adapter) with transformers + PEFT, and the adapter is promoted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tasks.training.params import build_params
from tasks.training.registry import ArtifactStore
from tests.support import olmo3_tiny as tiny
from tests.support.training import sft_parquet, train_profile, write_recipe


def _fields(path: Path) -> dict[str, Any]:
    import gguf

    reader = gguf.GGUFReader(path)
    return {name: f.contents() for name, f in reader.fields.items()
            if not name.startswith("tokenizer.")} | {"tensors": [t.name for t in reader.tensors]}


def test_base_gguf_is_olmo2_with_the_configs_sliding_window_pattern(
        olmo3_tiny: dict[str, Any]) -> None:
    """convert_hf_to_gguf.py writes OLMo 3 as `olmo2` with the per-layer window pattern."""
    f = _fields(olmo3_tiny["gguf"])
    assert f["general.architecture"] == "olmo2" and f["olmo2.block_count"] == tiny.LAYERS
    assert f["olmo2.attention.sliding_window"] == tiny.SLIDING_WINDOW
    # [sliding, sliding, sliding, full]: OLMo 3's layer_types (the converter's own default for
    # a config without layer_types is the same pattern, so this does not tell the two apart)
    assert f["olmo2.attention.sliding_window_pattern"] == [True, True, True, False]
    assert olmo3_tiny["config"]["layer_types"] == tiny.LAYER_TYPES
    assert f["olmo2.attention.head_count_kv"] == tiny.KV_HEADS
    assert f["olmo2.rope.scaling.type"] == "yarn" and f["olmo2.rope.scaling.factor"] == 8.0
    assert f["olmo2.rope.scaling.original_context_length"] == 8192
    assert {f"blk.0.attn_{n}_norm.weight" for n in ("q", "k")} <= set(f["tensors"])


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("four_bit", [False, True], ids=["lora", "qlora-4bit"])
def test_olmo3_trains_exports_verifies_and_promotes(olmo3_tiny: dict[str, Any], four_bit: bool,
                                                    tmp_path: Path) -> None:
    from flows.train import train

    recipe = write_recipe(tmp_path, base_model=str(olmo3_tiny["hf"]),
                          base_gguf=str(olmo3_tiny["gguf"]), export_gguf=True,
                          load_in_4bit=four_bit, max_length=64,
                          peft={"r": 8, "lora_alpha": 16, "lora_dropout": 0.0,
                                "target_modules": tiny.TARGETS},
                          sft={"max_steps": 4, "learning_rate": 0.01})
    profile = train_profile(tmp_path, tmp_path / "models", recipe=recipe)
    params = build_params(str(recipe), {"dataset": str(sft_parquet(tmp_path / "toy.parquet")),
                                        "method": "sft", "bucket": "engineering-pointsav"})
    m = train(params=params, profile=str(profile))

    assert m.state == "done" and m.step == 4
    assert m.verified is True and m.promoted is True, m.gate
    assert m.export["arch"] == "olmo2" and m.export["type"] == "adapter"
    assert m.export["tensors"] == tiny.LAYERS * len(tiny.TARGETS) * 2  # lora_a + lora_b each
    assert "convert_lora_to_gguf.py" in m.export["tool"]
    out = tmp_path / "state" / "artifacts" / "adapters" / m.name
    f = _fields(out / "adapter.gguf")
    assert f["general.type"] == "adapter" and f["adapter.lora.alpha"] == 16.0
    assert "blk.3.attn_k.weight.lora_b" in f["tensors"]
    report = json.loads((out / "verify.json").read_text())
    assert report["loaded"] and report["differs_from_base"] and report["matches_peft"]
    assert report["adapter_token_ids"] == report["peft_token_ids"]
    assert max(report["first_logit_max_abs_diff"]) < 0.05
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["state"] == "done" and manifest["verified"] and manifest["promoted"]
    assert manifest["params"]["load_in_4bit"] is four_bit
    store = ArtifactStore(tmp_path / "state" / "artifacts")
    assert store.pointer("engineering-pointsav").current == m.name
