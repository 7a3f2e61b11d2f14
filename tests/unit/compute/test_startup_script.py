"""The node's startup script and its engine command line (tasks/compute/gce/startup.py), as
rendered: the arguments vLLM gets, no secret in the text, valid bash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blocks.inference import InferenceEndpoint
from blocks.node_serve import NodeServeSettings
from tasks.compute.gce.startup import render_startup_script, vllm_launch_args


def test_vllm_launch_args() -> None:
    endpoint = InferenceEndpoint(model="olmo-3-32b-think", context_tokens=8192,
                                 max_output_tokens=3072)
    argv = vllm_launch_args(endpoint, host="10.128.0.5")
    assert argv[:3] == ["/opt/slm-nightly/.venv/bin/vllm", "serve",
                        "/opt/models/Olmo-3-32B-Think-Q3_K_M.gguf"]
    assert argv[argv.index("--tokenizer") + 1] == "/opt/models/Olmo-3-32B-Think"
    pairs = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert pairs["--host"] == "10.128.0.5" and pairs["--port"] == "9080"
    assert pairs["--max-model-len"] == "8192" and pairs["--served-model-name"] == "olmo-3-32b-think"
    assert pairs["--gpu-memory-utilization"] == "0.92"
    assert pairs["--structured-outputs-config"] == '{"backend": "xgrammar"}'
    assert pairs["--reasoning-parser"] == "olmo3"
    assert "--enable-lora" not in argv
    lora = vllm_launch_args(endpoint, {"a": "/opt/a", "b": "/opt/b"})
    i = lora.index("--lora-modules")
    assert "--enable-lora" in lora and lora[i + 1:i + 3] == ["a=/opt/a", "b=/opt/b"]
    assert lora[lora.index("--host") + 1] == "$VPC_IP"
    with pytest.raises(ValueError, match="every interface"):
        vllm_launch_args(endpoint, host="0.0.0.0")
    with pytest.raises(ValueError, match="absolute path on the node"):
        vllm_launch_args(endpoint, {"a": "relative/dir"})
    keyed = InferenceEndpoint(model="m", api_key="sk-node-secret")
    assert "sk-node-secret" not in " ".join(vllm_launch_args(keyed))
    with pytest.raises(ValueError, match="api_key_secret"):
        render_startup_script(keyed)
    script = render_startup_script(keyed, api_key_secret="vllm-key")
    assert "sk-node-secret" not in script and "\nsecret vllm-key ENGINE_API_KEY\n" in script


def test_startup_script_is_valid_bash(tmp_path: Path) -> None:
    script = render_startup_script(InferenceEndpoint(model="m"), {"x": "/opt/x"},
                                   settings=NodeServeSettings(engine="vllm",
                                                              prefect_api_url="http://p/api"))
    path = tmp_path / "s.sh"
    path.write_text(script)
    assert os.system(f"bash -n {path}") == 0
