"""GGUF LoRA export and verification on the real SmolLM2-135M (CPU).

The slow tests dequantize the bundled GGUF once per session, build a real PEFT adapter whose
lora_B is random (so it visibly changes greedy output), export it and let llama.cpp and
transformers+PEFT disagree if they can. The fast tests use a tiny randomly initialised llama
built in-process (no hub, no GGUF) for the scale arithmetic.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tasks.errors import AdapterVerificationError, ConfigError
from tasks.training import base_model, gguf_lora
from tasks.training.base_model import f32_gguf, hf_from_gguf
from tasks.training.gguf_lora import export_gguf_lora, rope_permute_rows
from tasks.training.verify import verify_adapter

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Prompt 0: a wrong q/k layout changes the answer; prompt 1: the adapter changes the answer.
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]
MAX_TOKENS = 10
THREADS = 1  # the 2 cores are shared: llama.cpp's 2 spinning threads were 4x slower under load
B_STD = 0.05  # lora_B scale: big enough to change greedy text, small enough to stay fluent


def _gguf_fields(path: Path) -> dict[str, Any]:
    import gguf

    reader = gguf.GGUFReader(path)
    out: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith(("general.", "adapter.")):
            out[name] = field.contents()
    out["tensors"] = {t.name: np.array(t.data) for t in reader.tensors}
    return out


# --- real model --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def hf_model(base_cache: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base_cache["hf"], dtype=torch.float32,
                                                local_files_only=True)


def _save_peft(model: Any, out: Path, targets: list[str], **lora: Any) -> Path:
    """A real PEFT LoRA on `model` with deterministic random lora_B, saved to `out`."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets,
                                                  **lora))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name or "lora_embedding_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * B_STD)
    peft_model.save_pretrained(out)
    peft_model.unload()  # give the base back untouched to the next test
    return out


@pytest.fixture(scope="session")
def peft_dir(hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_peft(hf_model, tmp_path_factory.mktemp("peft") / "adapter", TARGETS)


@pytest.fixture(scope="session")
def exported(peft_dir: Path, base_cache: dict[str, Any],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return export_gguf_lora(peft_dir, base_cache["hf"],
                            tmp_path_factory.mktemp("gguf") / "adapter.gguf")


@pytest.mark.slow
def test_dequantized_base_is_cached(base_cache: dict[str, Any],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Second call: same folder, no dequantization; the folder is a plain float32 HF model."""
    def rebuilt(*_: Any) -> None:
        raise AssertionError("the cached derivative was built again")

    monkeypatch.setattr(base_model, "_dequantize_into", rebuilt)
    monkeypatch.setattr(base_model, "_quantize_f32", rebuilt)
    again = hf_from_gguf(base_cache["gguf"], base_cache["cache"])
    assert again == base_cache["hf"]
    assert (again / "model.safetensors").is_file() and (again / "tokenizer.json").is_file()
    assert "quantization_config" not in (again / "config.json").read_text()
    assert f32_gguf(base_cache["gguf"], base_cache["cache"]) == base_cache["f32"]
    assert not [p for p in base_cache["cache"].iterdir() if p.name.startswith(".")]  # no temps


@pytest.mark.slow
def test_export_writes_llama_cpp_lora(exported: dict[str, Any], peft_dir: Path) -> None:
    """Metadata and names as llama.cpp reads them; q/k lora_B rope-permuted, the rest as-is."""
    from safetensors.numpy import load_file

    assert exported["arch"] == "llama" and exported["rank"] == 8 and exported["alpha"] == 16.0
    assert exported["tensors"] == 2 * 7 * 30 and exported["qk_permuted"] == 2 * 30
    f = _gguf_fields(Path(exported["path"]))
    assert f["general.type"] == "adapter" and f["adapter.type"] == "lora"
    assert f["general.architecture"] == "llama" and f["adapter.lora.alpha"] == 16.0
    peft = load_file(str(peft_dir / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.3.self_attn.{}_proj.lora_{}.weight"
    t = f["tensors"]
    np.testing.assert_array_equal(t["blk.3.attn_q.weight.lora_a"], peft[key.format("q", "A")])
    q_b, k_b = peft[key.format("q", "B")], peft[key.format("k", "B")]
    np.testing.assert_array_equal(t["blk.3.attn_q.weight.lora_b"], rope_permute_rows(q_b, 9))
    np.testing.assert_array_equal(t["blk.3.attn_k.weight.lora_b"], rope_permute_rows(k_b, 3))
    assert not np.array_equal(t["blk.3.attn_q.weight.lora_b"], q_b)
    np.testing.assert_array_equal(t["blk.3.attn_v.weight.lora_b"], peft[key.format("v", "B")])


@pytest.mark.slow
def test_verify_passes_on_f32_base(exported: dict[str, Any], peft_dir: Path,
                                   base_cache: dict[str, Any]) -> None:
    """llama.cpp + adapter == transformers + PEFT, token for token, and != base."""
    report = verify_adapter(base_cache["f32"], Path(exported["path"]), base_cache["hf"], peft_dir,
                            PROMPTS, max_tokens=MAX_TOKENS, n_threads=THREADS)
    assert report["loaded"] and report["differs_from_base"] and report["matches_peft"]
    assert report["adapter_outputs"] == report["peft_outputs"]
    assert report["adapter_outputs"] != report["base_outputs"]
    assert max(report["first_logit_max_abs_diff"]) < 0.1


@pytest.mark.slow
def test_verify_catches_missing_qk_permutation(peft_dir: Path, base_cache: dict[str, Any],
                                               tmp_path: Path) -> None:
    """The classic silent bug: copying PEFT q/k tensors unchanged loads fine, answers wrong."""
    wrong = gguf_lora._export(peft_dir, base_cache["hf"], tmp_path / "wrong.gguf", "f32",
                              permute_qk=False)
    with pytest.raises(AdapterVerificationError, match="differs from HF\\+PEFT") as e:
        verify_adapter(base_cache["f32"], Path(wrong["path"]), base_cache["hf"], peft_dir,
                       PROMPTS, max_tokens=MAX_TOKENS, n_threads=THREADS)
    assert e.value.report["loaded"] and not e.value.report["matches_peft"]
    assert max(e.value.report["first_logit_max_abs_diff"]) > 1.0


@pytest.mark.slow
def test_corrupt_or_missing_adapter_is_not_loaded(exported: dict[str, Any], peft_dir: Path,
                                                  base_cache: dict[str, Any], tiny: tuple[Any, Path],
                                                  tmp_path: Path) -> None:
    """Truncated, made for another base, missing: an error saying 'not loaded', never a crash.

    The wrong-shape adapter is the dangerous one: llama-cpp-python's Llama() returns with a
    null adapter and the first decode segfaults (measured: exit 139), so the check must happen
    before generating, and in a child."""
    good = Path(exported["path"])
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    model, tiny_base = tiny
    other_base = export_gguf_lora(_save_peft(model, tmp_path / "tiny", TARGETS), tiny_base,
                                  tmp_path / "other-base.gguf")
    for bad in (truncated, Path(other_base["path"]), tmp_path / "missing.gguf"):
        with pytest.raises(AdapterVerificationError, match="adapter not loaded") as e:
            verify_adapter(base_cache["f32"], bad, base_cache["hf"], peft_dir, PROMPTS[:1],
                           max_tokens=2, n_threads=THREADS)
        assert e.value.report["loaded"] is False
        assert str(bad) in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["lm_head", "embed_tokens"])
def test_lora_on_embeddings_or_lm_head_is_refused(target: str, hf_model: Any,
                                                  base_cache: dict[str, Any],
                                                  tmp_path: Path) -> None:
    adapter = _save_peft(hf_model, tmp_path / "adapter", ["q_proj", target])
    out = tmp_path / "out.gguf"
    with pytest.raises(ConfigError, match=f"{target}.*target_modules"):
        export_gguf_lora(adapter, base_cache["hf"], out)
    assert not out.exists() and not list(tmp_path.glob(".out.gguf*"))


# --- tiny in-process llama: scale arithmetic ---------------------------------------------------


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Any, Path]:
    """A 2-layer random llama (GQA: 4 heads, 2 KV heads) saved as a base folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2))
    base = tmp_path / "base"
    model.config.save_pretrained(base)
    return model, base


def test_rslora_alpha_keeps_peft_scale(tiny: tuple[Any, Path], tmp_path: Path) -> None:
    """rsLoRA scales by alpha/sqrt(r); llama.cpp by alpha/r: the alpha written is alpha·sqrt(r)."""
    model, base = tiny
    adapter = _save_peft(model, tmp_path / "a", TARGETS, use_rslora=True)
    report = export_gguf_lora(adapter, base, tmp_path / "a.gguf", dtype="f16")
    assert report["alpha"] == pytest.approx(16 * math.sqrt(8))
    assert report["alpha"] / 8 == pytest.approx(16 / math.sqrt(8))  # = PEFT's scaling
    f = _gguf_fields(tmp_path / "a.gguf")
    assert f["adapter.lora.alpha"] == pytest.approx(16 * math.sqrt(8), rel=1e-6)
    assert f["tensors"]["blk.0.ffn_up.weight.lora_a"].dtype == np.float16


def test_alpha_pattern_is_folded_into_lora_b(tiny: tuple[Any, Path], tmp_path: Path) -> None:
    """Per-module alpha: one alpha per GGUF file, so the odd module's lora_B carries the ratio."""
    from safetensors.numpy import load_file

    model, base = tiny
    adapter = _save_peft(model, tmp_path / "a", TARGETS, alpha_pattern={"down_proj": 4})
    report = export_gguf_lora(adapter, base, tmp_path / "a.gguf")
    assert report["alpha"] == 16.0 and report["scale_folded_modules"] == 2  # 2 layers' down_proj
    peft = load_file(str(adapter / "adapter_model.safetensors"))
    got = _gguf_fields(tmp_path / "a.gguf")["tensors"]["blk.1.ffn_down.weight.lora_b"]
    want = peft["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"] * (4 / 16)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_unsupported_features_are_refused(tiny: tuple[Any, Path], tmp_path: Path) -> None:
    model, base = tiny
    adapter = _save_peft(model, tmp_path / "dora", ["q_proj"], use_dora=True)
    with pytest.raises(ConfigError, match="use_dora"):
        export_gguf_lora(adapter, base, tmp_path / "dora.gguf")
    (adapter / "adapter_config.json").unlink()
    with pytest.raises(ConfigError, match="adapter_config.json"):
        export_gguf_lora(adapter, base, tmp_path / "dora.gguf")
    shutil.rmtree(adapter)


def test_rope_permutation_interleaves_halves() -> None:
    """Per head, HF rows [x0 x1 | y0 y1] become llama.cpp's [x0 y0 x1 y1]."""
    rows = np.arange(8, dtype=np.float32)[:, None]  # 2 heads of dim 4
    assert rope_permute_rows(rows, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    with pytest.raises(ConfigError, match="heads"):
        rope_permute_rows(rows, 3)
