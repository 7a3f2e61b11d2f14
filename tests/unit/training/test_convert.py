"""What llama.cpp's LoRA converter can export, decided before any weight loads.

Expected answers come from reading the installed convert_lora_to_gguf.py (llama-cpp-python
0.3.36): one `adapter.lora.alpha` per file, llama.cpp scales each tensor by alpha / its own
rank, and any tensor that is not a lora_A/lora_B pair makes it exit. The architecture list is
the converter's TEXT_MODEL_MAP, read without importing it (no torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.engine import llama_cpp as lc
from tasks.shared.errors import ConfigError
from tasks.training import convert
from tasks.training.params import LLAMA_TARGETS

OLMO3 = {"architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3"}
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": LLAMA_TARGETS}


def test_the_converter_registers_the_production_and_local_architectures() -> None:
    supported = convert.supported_architectures()
    assert {"Olmo3ForCausalLM", "Olmo2ForCausalLM", "LlamaForCausalLM"} <= supported
    assert "NotAModelForCausalLM" not in supported
    assert len(supported) > 100  # the whole registry, not a hand-kept subset


def test_the_production_base_and_lora_are_exportable() -> None:
    assert convert.export_problems(OLMO3, LORA) == []
    # A per-module rank is exported right: llama.cpp divides alpha by each tensor's own rank.
    assert convert.export_problems(OLMO3, {**LORA, "rank_pattern": {"down_proj": 4}}) == []
    assert convert.export_problems(OLMO3, {**LORA, "target_modules": "all-linear"}) == []


@pytest.mark.parametrize(("lora", "says"), [
    ({"use_rslora": True}, "peft.use_rslora: false"),
    ({"alpha_pattern": {"down_proj": 8}}, "remove peft.alpha_pattern"),
    ({"use_dora": True}, "peft.use_dora: false"),
    ({"modules_to_save": ["lm_head"]}, "remove peft.modules_to_save"),
    ({"bias": "lora_only"}, "peft.bias: none"),
    ({"target_modules": ["q_proj", "lm_head"]}, "'lm_head'"),
    ({"target_modules": ["q_proj", "embed_tokens"]}, "'embed_tokens'"),
    ({"target_modules": r".*\.(q_proj|embed_tokens)"}, "'embed_tokens'"),
    ({"trainable_token_indices": [1, 2]}, "remove peft.trainable_token_indices"),
    ({"peft_type": "IA3"}, "only LoRA adapters"),
])
def test_what_the_converter_would_drop_or_refuse_is_named_with_the_fix(
        lora: dict[str, object], says: str) -> None:
    problems = convert.export_problems(OLMO3, {**LORA, **lora})
    assert len(problems) == 1 and says in problems[0], problems


def test_an_unsupported_or_unnamed_architecture_is_a_problem() -> None:
    (problem,) = convert.export_problems({"architectures": ["Olmo9ForCausalLM"]}, LORA)
    assert "Olmo9ForCausalLM is not supported" in problem and "Olmo3ForCausalLM" in problem
    assert "export_gguf: false" in problem
    (problem,) = convert.export_problems({"model_type": "olmo3"}, LORA)
    assert "names no `architectures`" in problem
    # A multimodal checkpoint routes on its text model, as the converter does.
    text = {"architectures": ["Whatever"], "text_config": {"architectures": ["LlamaForCausalLM"]}}
    assert convert.export_problems(text, LORA) == []


def test_missing_tools_name_the_install_command(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lc.TOOLS_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"not installed at .*nowhere.*run `make`"):
        convert.export_problems(OLMO3, LORA)
    with pytest.raises(ConfigError, match=r"python -m tasks.training.convert install"):
        convert.export_base(tmp_path, tmp_path / "x.gguf")
