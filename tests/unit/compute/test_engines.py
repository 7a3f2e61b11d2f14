"""The node's engine check from each engine's own list of GGUF architectures, the settings that
replace [compute.vllm], and what the rendered startup script runs (tasks/compute/engines.py,
blocks/node_serve.py, tasks/compute/gce/startup.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from blocks.inference import InferenceEndpoint
from blocks.node_serve import NodeServeSettings
from tasks.compute.engines import (
    engine_problems,
    llama_cpp_architectures,
    vllm_architectures,
    worker_command,
)
from tasks.compute.gce.startup import render_startup_script
from tasks.shared.errors import ConfigError
from tests.support.profiles import toml_profile


def test_the_operators_model_loads_in_llama_cpp_and_not_in_vllm() -> None:
    # olmo2 is what llama.cpp's converter writes for OLMo 3 (llama-arch.cpp of llama-cpp-python
    # 0.3.36 lists olmo, olmo2, olmoe); transformers' GGUF table has no olmo family at all
    # (vllm-project/vllm#30691: "GGUF model with architecture olmo2 is not supported yet")
    assert {"olmo", "olmo2", "olmoe", "llama", "qwen3"} <= llama_cpp_architectures()
    assert "olmo3" not in llama_cpp_architectures()
    assert {"llama", "qwen2", "gemma3"} <= vllm_architectures()
    assert not {"olmo", "olmo2", "olmoe"} & vllm_architectures()
    assert engine_problems(NodeServeSettings()) == []  # the default pair: llama.cpp + olmo2
    (vllm,) = engine_problems(NodeServeSettings(engine="vllm"))
    assert vllm.startswith("engine vllm cannot load /opt/models/Olmo-3-32B-Think-Q3_K_M.gguf: "
                           "its GGUF loader (transformers ")
    assert "no architecture 'olmo2'" in vllm and "vllm-project/vllm#30691" in vllm
    assert vllm.endswith('set [compute.node] engine = "llama.cpp" (it loads olmo2)')
    # a pair vLLM does load, by transformers' rename of llama.cpp's name (qwen2moe → qwen2_moe)
    assert engine_problems(NodeServeSettings(engine="vllm", model_architecture="llama")) == []
    assert engine_problems(NodeServeSettings(engine="vllm",
                                             model_architecture="qwen2moe")) == []


def test_an_unknown_architecture_is_refused_by_both_engines() -> None:
    (cpp,) = engine_problems(NodeServeSettings(model_architecture="olmo3"))
    assert cpp.startswith("engine llama.cpp cannot load /opt/models/Olmo-3-32B-Think-Q3_K_M.gguf:"
                          " architecture 'olmo3' is not in the pinned llama.cpp's list (")
    assert cpp.endswith("src/llama-arch.cpp) — serve a model of a listed architecture, or fix "
                        "[compute.node] model_architecture to the GGUF's general.architecture")
    (v,) = engine_problems(NodeServeSettings(engine="vllm", model_architecture="olmo3"))
    assert v.endswith("— serve a model of an architecture it lists, or fix model_architecture")


def test_a_missing_llama_cpp_list_says_so_and_how_to_install_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLM_LLAMA_CPP_TOOLS", str(tmp_path))
    (msg,) = engine_problems(NodeServeSettings())
    assert msg == (f"llama.cpp's architecture list {tmp_path}/src/llama-arch.cpp is not "
                   "installed, so the engine check cannot run — run `make` (or `python -m "
                   "tasks.training.convert install`)")


def test_the_dialect_must_match_the_engine() -> None:
    assert engine_problems(NodeServeSettings(), dialect="llama.cpp") == []
    (msg,) = engine_problems(NodeServeSettings(), dialect="vllm")
    assert msg == ("engine llama.cpp needs the inference block's dialect 'llama.cpp', not "
                   "'vllm' (its structured-output request shape) — set [inference] dialect = "
                   "\"llama.cpp\"")
    assert engine_problems(NodeServeSettings(engine="vllm", model_architecture="llama"),
                           dialect="vllm") == []


def test_settings_refuse_a_hub_tokenizer_and_the_removed_binaries() -> None:
    with pytest.raises(ValidationError, match="'allenai/Olmo-3-32B-Think' is not an absolute "
                       "folder on the node — the node boots offline"):
        NodeServeSettings(tokenizer="allenai/Olmo-3-32B-Think")
    with pytest.raises(ValidationError, match=r"prefect_bin: the worker is "
                       r"\{project_dir\}/.venv/bin/prefect — set project_dir"):
        NodeServeSettings(prefect_bin="/opt/prefect/bin/prefect")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="a plain unix user name other than root"):
        NodeServeSettings(service_user="root")


def test_a_compute_vllm_table_is_refused_naming_the_rename(tmp_path: Path) -> None:
    from tasks.profile import load_profile

    path = toml_profile(tmp_path / "p.toml", compute={
        "type": "gce", "project": "p", "zone": "z", "instance": "n",
        "vllm": {"model_path": "/opt/m.gguf"}})
    with pytest.raises(ConfigError, match=r"\[compute.vllm\] is now \[compute.node\]"):
        load_profile(str(path))


def test_the_worker_runs_from_the_nodes_one_environment() -> None:
    s = NodeServeSettings(project_dir="/srv/slm", work_pool="gpu", prefect_api_url="http://p/api",
                          hf_home="/srv/hf")
    assert worker_command(s) == ["/srv/slm/.venv/bin/prefect", "worker", "start", "--pool",
                                 "gpu", "--type", "process"]
    script = render_startup_script(InferenceEndpoint(model="m", dialect="llama.cpp"), settings=s)
    worker_unit = script[script.index("/etc/systemd/system/slm-prefect-worker.service"):]
    assert ("ExecStart=/srv/slm/.venv/bin/prefect worker start --pool gpu --type process\n"
            in worker_unit)
    assert "WorkingDirectory=/srv/slm\n" in worker_unit and "User=slm\n" in worker_unit
    assert "Environment=HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=/srv/hf\n" in worker_unit
    # llama-server of the node's environment: 8 slots (the endpoint's default ceiling) of 4096
    # tokens, every layer on the card, one alias, no prompt cache, 3 context checkpoints per
    # slot, no idle-slot saves (tasks/compute/host_memory.py), no /slots (it shows the prompts
    # being processed to anyone on the VPC), the shipped chat template of the node's checkout
    assert ("exec /srv/slm/.venv/bin/llama-server -m /opt/models/Olmo-3-32B-Think-Q3_K_M.gguf "
            "-a m --host \"$VPC_IP\" --port 9080 -np 8 -c 32768 -t 2 -tb 2 --metrics "
            "--no-webui -ngl all --fit off --cache-ram 0 --ctx-checkpoints 3 "
            "--no-cache-idle-slots --no-slots -ctk f16 -ctv f16 --chat-template-file "
            "/srv/slm/tasks/compute/templates/olmo3-think.jinja\n") in script
    assert "[ -x /srv/slm/.venv/bin/llama-server ] || fail" in script


def test_a_startup_error_of_an_earlier_boot_is_not_this_boots() -> None:
    from tasks.compute.gce.boot_status import parse_error

    # guest attributes outlive a stop/start: "<epoch> <message>" older than the last start
    # (beyond 5 s of clock slack) belongs to an earlier boot
    assert parse_error("1700000000 reading secret x failed", 1700000100.0) is None
    assert parse_error("1700000100 reading secret x failed", 1700000096.0) == \
        "reading secret x failed"
    assert parse_error("1700000100 boom", None) == "boom"
    assert parse_error("", 1.0) is None
    assert parse_error("not ours", 1.0) == "not ours"
