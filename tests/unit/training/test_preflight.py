"""Preflight from config files: the production recipe passes on its node, the plan that cannot
fit is refused with both numbers, an architecture llama.cpp's converter does not register and
a base model missing from the cache fail — all without a weight (or a hub) in sight."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tasks.shared.checks import PreflightFailed
from tasks.training.memory import G2_STANDARD_4, GIB, NodeLimits
from tasks.training.params import TrainParams, resolve
from tasks.training.preflight import preflight, require, verify_plan


def _production(**overrides: Any) -> Any:
    return resolve(TrainParams(dataset="", method="sft", recipe="production",
                               overrides=overrides))


def _statuses(checks: list[Any]) -> dict[str, str]:
    return {c.name: c.status for c in checks}


def test_the_production_recipe_passes_preflight_on_its_node() -> None:
    checks = preflight(_production(), G2_STANDARD_4, weights_here=False)
    assert _statuses(checks) == {"base model": "skipped", "model shape": "ok", "export": "ok",
                                 "verification fits": "ok", "base GGUF": "skipped"}
    by = {c.name: c.detail for c in checks}
    assert "olmo3: 7,298,011,136 parameters" in by["model shape"]
    assert by["export"].startswith("Olmo3ForCausalLM is registered")
    assert by["verification fits"].startswith("plan cuda: RAM 6.4 GiB") and "GPU 15.5 GiB" \
        in by["verification fits"]
    require(checks)  # does not raise


def test_the_cpu_plan_is_refused_for_the_7b_naming_31_gib_against_16() -> None:
    checks = preflight(_production(verify_device="cpu"), G2_STANDARD_4, weights_here=False)
    [fit] = [c for c in checks if c.name == "verification fits"]
    assert fit.status == "failed"
    assert "verification plan cpu does not fit the node: estimated RAM 31.3 GiB > 16.0 GiB " \
        "(g2-standard-4" in fit.detail
    assert "set verify_device: cuda in the recipe (estimate: plan cuda: RAM 6.4 GiB" in fit.detail
    with pytest.raises(PreflightFailed, match=r"before any weight loaded: verification fits: "
                       r"verification plan cpu does not fit"):
        require(checks)


def test_auto_is_cuda_on_a_node_with_a_gpu_and_cpu_without() -> None:
    assert verify_plan("auto", G2_STANDARD_4) == "cuda"
    assert verify_plan("auto", NodeLimits(ram=24 * GIB, vram=0, source="cpu only")) == "cpu"
    assert verify_plan("cpu", G2_STANDARD_4) == "cpu"
    # auto on a CPU-only node picks the cpu plan, which the 7B cannot fit in 16 GiB
    cpu_node = NodeLimits(ram=16 * GIB, vram=0, source="a 16 GiB CPU node")
    checks = preflight(_production(verify_device="auto"), cpu_node, weights_here=False)
    assert _statuses(checks)["verification fits"] == "failed"


def test_an_architecture_the_converter_does_not_register_fails(tmp_path: Path) -> None:
    config = json.loads((Path(__file__).parents[3] / "recipes" / "models" /
                         "olmo-3-7b-think.config.json").read_text())
    config["architectures"] = ["Olmo4ForCausalLM"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    checks = preflight(_production(), G2_STANDARD_4, weights_here=False, base_config=path)
    [export] = [c for c in checks if c.name == "export"]
    assert export.status == "failed"
    assert "architecture Olmo4ForCausalLM is not supported by llama.cpp's converter" in \
        export.detail


def test_a_base_model_missing_from_the_cache_fails_without_the_hub(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    checks = preflight(_production(), G2_STANDARD_4, weights_here=True)
    [base] = [c for c in checks if c.name == "base model"]
    assert base.status == "failed"
    assert "allenai/Olmo-3-7B-Think@main: not in the local Hugging Face cache" in base.detail
    # the shape still comes from the recipe's base_config, so the other checks still run
    assert _statuses(checks)["verification fits"] == "ok"
    assert _statuses(checks)["base GGUF"] == "failed"  # /opt/models/… is not on this machine


def test_node_memory_from_the_profile_else_a_g2_standard_4(tmp_path: Path) -> None:
    from tasks.profile import load_profile
    from tasks.training.preflight import node_limits
    from tests.support.profiles import toml_profile

    gce = {"type": "gce", "project": "p", "zone": "us-central1-a", "instance": "slm-node"}
    default = toml_profile(tmp_path / "a.toml", state_dir=tmp_path / "s", compute=gce)
    assert node_limits(load_profile(str(default))) == G2_STANDARD_4
    assert G2_STANDARD_4.ram == 16 * 2**30 and G2_STANDARD_4.vram == 23034 * 2**20
    bigger = toml_profile(tmp_path / "b.toml", state_dir=tmp_path / "s", compute=gce,
                          training={"node_ram_gib": 32})
    limits = node_limits(load_profile(str(bigger)))
    assert (limits.ram, limits.vram) == (32 * 2**30, 23034 * 2**20)  # the L4 stays
    # The 7B's cpu plan (31.3 GiB) fits a 32 GiB node: the refusal follows the setting.
    checks = preflight(_production(verify_device="cpu"), limits, weights_here=False)
    assert _statuses(checks)["verification fits"] == "ok"
    local = toml_profile(tmp_path / "c.toml", state_dir=tmp_path / "s",
                         compute={"type": "local"}, training={"node_vram_gib": 0})
    here = node_limits(load_profile(str(local)))
    with open("/proc/meminfo") as f:
        total_kib = int(f.readline().split()[1])  # MemTotal, the first line
    assert here.vram == 0 and abs(here.ram - total_kib * 1024) < 64 * 2**20


def test_the_cli_prints_each_check_and_exits_1_on_a_failure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from flows.cli import build_parser
    from flows.cli.train import _preflight
    from tasks.training.params import RECIPE_DIR

    args = build_parser().parse_args(["train", "preflight", "--recipe", "production"])
    assert _preflight(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("preflight of ") and "g2-standard-4" in out[0]
    assert [line.split()[0] for line in out[1:]] == ["SKIPPED", "OK", "OK", "OK", "SKIPPED"]
    recipe = yaml.safe_load((RECIPE_DIR / "production.yaml").read_text())
    recipe["verify_device"] = "cpu"
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(recipe))
    args = build_parser().parse_args(["train", "preflight", "--recipe",
                                      str(tmp_path / "cpu.yaml"), "--json"])
    assert _preflight(args) == 1
    fit = {c["check"]: c for c in json.loads(capsys.readouterr().out)}["verification fits"]
    assert fit["status"] == "failed" and "RAM 31.3 GiB > 16.0 GiB" in fit["detail"]
