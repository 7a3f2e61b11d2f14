"""llama.cpp's own converters as the project's GGUF exporter, and the verification that checks
whatever they export, on the real SmolLM2-135M (llama architecture) on the CPU.

The slow tests dequantize the bundled GGUF once per session (base_cache), build a real PEFT
adapter whose lora_B is random (so it visibly changes greedy output), export it with
convert_lora_to_gguf.py and let llama.cpp and transformers+PEFT disagree if they can. The fast
ones use a tiny random llama built in-process (no hub, no GGUF).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tasks.engine import llama_cpp as lc
from tasks.shared.errors import AdapterVerificationError, ConfigError
from tasks.training import base_model, convert
from tasks.training.base_model import f32_gguf, hf_from_gguf
from tasks.training.convert import ConversionError, export_lora
from tasks.training.verify import AdapterFiles, verify_adapter

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Prompt 0: a wrong q/k layout changes the answer; prompt 1: the adapter changes the answer.
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]
MAX_TOKENS = 10
THREADS = 1  # the 2 cores are shared: llama.cpp's 2 spinning threads were 4x slower under load
B_STD = 0.05  # lora_B scale: big enough to change greedy text, small enough to stay fluent
PEFT_KEY = "base_model.model.model.layers.{}.self_attn.{}_proj.lora_{}.weight"


def hf_to_gguf_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama's q/k output rows, HF order → GGUF order, written from the layouts themselves: per
    head HF keeps the rotary pairs as two halves [x0 x1 … | y0 y1 …], llama.cpp interleaves them
    [x0 y0 x1 y1 …]. Independent of the converter's own `LlamaModel.permute`."""
    d = w.shape[0] // n_head
    out = np.empty_like(w)
    for h in range(n_head):
        head = w[h * d:(h + 1) * d]
        out[h * d:(h + 1) * d:2], out[h * d + 1:(h + 1) * d:2] = head[:d // 2], head[d // 2:]
    return out


def _tensors(path: Path) -> dict[str, np.ndarray]:
    import gguf

    return {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}


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


# --- the tools --------------------------------------------------------------------------------


def test_install_unpacks_only_the_converters_and_is_idempotent(tmp_path: Path) -> None:
    """From the pinned sdist (pip's cache): the two converters, conversion/, gguf-py, LICENSE,
    and llama.cpp's architecture list (src/llama-arch.cpp, read by the engine check)."""
    dest = convert.install(tmp_path / "tools")
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [m.rstrip("/") for m in convert.MEMBERS] + ["VERSION", "src"])
    assert [p.name for p in (dest / "src").iterdir()] == ["llama-arch.cpp"]
    assert (dest / "VERSION").read_text() == f"llama-cpp-python {lc.llama_cpp_version()}\n"
    assert (dest / "conversion" / "olmo.py").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    mtime = (dest / "VERSION").stat().st_mtime_ns
    assert convert.install(dest) == dest and (dest / "VERSION").stat().st_mtime_ns == mtime


# --- tiny in-process llama ---------------------------------------------------------------------


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
    model.config.architectures = ["LlamaForCausalLM"]  # save_pretrained of the model sets it
    model.config.save_pretrained(base)  # the converter needs the config only
    return model, base


@pytest.mark.parametrize("target", ["lm_head", "embed_tokens"])
def test_lora_on_embeddings_or_lm_head_is_refused_before_converting(
        target: str, tiny: tuple[Any, Path], tmp_path: Path) -> None:
    model, base = tiny
    adapter = _save_peft(model, tmp_path / "adapter", ["q_proj", target])
    out = tmp_path / "out.gguf"
    with pytest.raises(ConfigError, match=f"'{target}'.*target_modules"):
        export_lora(adapter, base, out)
    assert not out.exists() and not list(tmp_path.glob(".out.gguf*"))


def test_a_converter_failure_names_the_command_and_its_stderr(tiny: tuple[Any, Path],
                                                              tmp_path: Path) -> None:
    model, base = tiny
    adapter = _save_peft(model, tmp_path / "adapter", TARGETS)
    (adapter / "adapter_model.safetensors").write_bytes(b"not safetensors")
    out = tmp_path / "out.gguf"
    with pytest.raises(ConversionError, match=r"(?s)convert_lora_to_gguf\.py.*--base.*Error"):
        export_lora(adapter, base, out)
    assert not out.exists() and not list(tmp_path.glob(".out.gguf*"))  # no torn file left


# --- the real model ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def hf_model(base_cache: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base_cache["hf"], dtype=torch.float32,
                                                local_files_only=True)


@pytest.fixture(scope="session")
def peft_dir(hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_peft(hf_model, tmp_path_factory.mktemp("peft") / "adapter", TARGETS)


@pytest.fixture(scope="session")
def exported(peft_dir: Path, base_cache: dict[str, Any],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return export_lora(peft_dir, base_cache["hf"],
                       tmp_path_factory.mktemp("gguf") / "adapter.gguf")


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


def test_the_converter_rope_permutes_llama_qk(exported: dict[str, Any], peft_dir: Path) -> None:
    """SmolLM2 (9 heads, 3 KV heads, 30 layers): q/k lora_B in GGUF row order, the rest as-is."""
    import gguf
    from safetensors.numpy import load_file

    assert exported["arch"] == "llama" and exported["type"] == "adapter"
    assert exported["tensors"] == 2 * 7 * 30
    reader = gguf.GGUFReader(exported["path"])
    assert reader.fields["adapter.lora.alpha"].contents() == 16.0
    peft, t = load_file(str(peft_dir / "adapter_model.safetensors")), _tensors(exported["path"])
    np.testing.assert_array_equal(t["blk.3.attn_q.weight.lora_a"], peft[PEFT_KEY.format(3, "q", "A")])
    q_b, k_b = peft[PEFT_KEY.format(3, "q", "B")], peft[PEFT_KEY.format(3, "k", "B")]
    np.testing.assert_array_equal(t["blk.3.attn_q.weight.lora_b"], hf_to_gguf_rows(q_b, 9))
    np.testing.assert_array_equal(t["blk.3.attn_k.weight.lora_b"], hf_to_gguf_rows(k_b, 3))
    assert not np.array_equal(t["blk.3.attn_q.weight.lora_b"], q_b)
    np.testing.assert_array_equal(t["blk.3.attn_v.weight.lora_b"], peft[PEFT_KEY.format(3, "v", "B")])


def test_verify_passes_on_f32_base(exported: dict[str, Any], peft_dir: Path,
                                   base_cache: dict[str, Any]) -> None:
    """llama.cpp + adapter == transformers + PEFT, token for token, and != base."""
    report = verify_adapter(AdapterFiles(base_cache["f32"], Path(exported["path"]),
                                         base_cache["hf"], peft_dir),
                            PROMPTS, max_tokens=MAX_TOKENS, n_threads=THREADS)
    assert report["loaded"] and report["differs_from_base"] and report["matches_peft"]
    assert report["adapter_outputs"] == report["peft_outputs"]
    assert report["adapter_outputs"] != report["base_outputs"]
    assert max(report["first_logit_max_abs_diff"]) < 0.1


def _unpermuted_copy(exported: dict[str, Any], peft_dir: Path, out: Path) -> Path:
    """The converter's adapter with q/k lora_B put back in HF order: the classic wrong export
    (copying PEFT tensors as they are) — it loads fine and computes something else."""
    import gguf
    from safetensors.numpy import load_file

    peft = load_file(str(peft_dir / "adapter_model.safetensors"))
    reader = gguf.GGUFReader(exported["path"])
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, reader.fields["adapter.lora.alpha"].contents())
    for t in reader.tensors:
        data = np.array(t.data)
        blk, kind = t.name.split(".")[1:3]
        if kind in ("attn_q", "attn_k") and t.name.endswith("lora_b"):
            data = peft[PEFT_KEY.format(blk, kind[-1], "B")]
        writer.add_tensor(t.name, np.ascontiguousarray(data, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def test_verify_catches_an_unpermuted_qk_layout(exported: dict[str, Any], peft_dir: Path,
                                                base_cache: dict[str, Any],
                                                tmp_path: Path) -> None:
    wrong = _unpermuted_copy(exported, peft_dir, tmp_path / "wrong.gguf")
    with pytest.raises(AdapterVerificationError, match="differs from HF\\+PEFT") as e:
        verify_adapter(AdapterFiles(base_cache["f32"], wrong, base_cache["hf"], peft_dir),
                       PROMPTS, max_tokens=MAX_TOKENS, n_threads=THREADS)
    assert e.value.report["loaded"] and not e.value.report["matches_peft"]
    assert max(e.value.report["first_logit_max_abs_diff"]) > 1.0


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
    other_base = export_lora(_save_peft(model, tmp_path / "tiny", TARGETS), tiny_base,
                             tmp_path / "other-base.gguf")
    for bad in (truncated, Path(other_base["path"]), tmp_path / "missing.gguf"):
        with pytest.raises(AdapterVerificationError, match="adapter not loaded") as e:
            verify_adapter(AdapterFiles(base_cache["f32"], bad, base_cache["hf"], peft_dir),
                           PROMPTS[:1], max_tokens=2, n_threads=THREADS)
        assert e.value.report["loaded"] is False
        assert str(bad) in str(e.value)
