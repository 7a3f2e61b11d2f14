"""A GCE node whose boot runs the rendered startup script with a real `prefect worker`, on the
fake Compute Engine and the Prefect test harness's server."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

from blocks.gce import GceCompute
from tasks.compute.gce.startup import ENGINE_UNIT
from tasks.shared.processes import free_port
from tests.fakes.compute_engine import FakeComputeEngine
from tests.fakes.node_runtime import FakeNode
from tests.support.gce import PROJECT, VLLM_NODE, creds, gce_profile
from tests.support.paths import ROOT


def harness_api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    assert url, "the Prefect test harness sets PREFECT_API_URL"
    return str(url)


class WorkerNode:
    """The fake Compute Engine with one zone's instance whose boot runs the rendered startup
    script (tests/fakes/node_runtime.py, paths mapped to this test's): its engine unit replaced by the
    fake OpenAI server (tests/fakes/openai_server.py) for speed, its worker unit exactly as rendered —
    the real `prefect worker` of the node's one environment on slm-node."""

    def __init__(self, tmp: Path, fake: FakeComputeEngine | None = None,
                 at: tuple[str, str, str] = (PROJECT, "zone-a", "node")) -> None:
        """`fake`: a Compute Engine whose project already has (or will get) the instance
        `at` = (project, zone, name); by default a fake of its own with that instance."""
        self.port = free_port()
        self.project, self.zone, self.instance = at
        self.runtime = FakeNode(tmp, project=self.project, only={self.instance},
                                env={"PREFECT_WORKER_QUERY_SECONDS": "1",
                                     "PREFECT_LOGGING_LEVEL": "INFO"},
                                unit_overrides={ENGINE_UNIT: [
                                    sys.executable, "-m", "tests.fakes.openai_server", "--port",
                                    str(self.port)]})
        self.log = self.runtime.log_path(self.zone, self.instance)
        if fake is None:
            fake = FakeComputeEngine(PROJECT)
            fake.add_instance(self.zone, self.instance, boot_seconds=0.3)
        self.fake = fake
        self.runtime.attach(self.fake)

    def install(self, profile: Path, base: dict[str, Any]) -> None:
        """The node image, as this test's paths: the node's checkout is this repository, its
        model and tokenizer the test's (vLLM's binary, not installed here, maps to python).
        The startup script itself is NOT written here: the nightly (and `node smoke`) render it
        from the profile's blocks into the instance's metadata before the start
        (GceNode.prepare), and the runtime boots whatever the metadata holds."""
        from tasks.profile import load_profile

        cfg = load_profile(str(profile))
        compute = cfg.compute
        assert isinstance(compute, GceCompute)
        s = compute.node
        self.runtime.paths = {s.project_dir: str(ROOT), s.model_path: str(base["gguf"]),
                              s.tokenizer: str(base["hf"]), s.hf_home: str(profile.parent / "hf"),
                              s.venv_bin("vllm"): sys.executable}

    def profile(self, tmp: Path, block: str, base: dict[str, Any], max_steps: int,
                gcs_block: str | None = None, adc: bool = False) -> Path:
        """`adc`: the block names no credentials (the orchestrator's own account, as on its
        VM: application-default credentials), else a key of the fake's own."""
        # the node's checkout is this one (where train/node changes into), its worker talks
        # to the test server: what the preflight checks before the nightly boots it
        GceCompute(project=self.project, zone=self.zone, instance=self.instance,
                   api_endpoint=self.fake.url,
                   gcp_credentials=None if adc else creds(self.fake), poll_seconds=0.2,
                   inference_port=self.port,
                   state_dir=str(tmp / "state"),
                   node={**VLLM_NODE, "project_dir": str(ROOT), "prefect_api_url": harness_api_url()}
                   ).save(block, overwrite=True)
        recipe = tmp / "recipe.yaml"
        recipe.write_text(textwrap.dedent(f"""
            peft: {{r: 4, lora_alpha: 8, lora_dropout: 0.0}}
            activation_checkpointing: false
            per_device_train_batch_size: 2
            max_length: 96
            logging_steps: 1
            save_steps: 2
            max_eval_rows: 2
            export_gguf: false
            sft: {{max_steps: {max_steps}, learning_rate: 0.005}}
            dpo: {{max_steps: 1, learning_rate: 0.0005}}
        """))
        path = gce_profile(
            tmp, block, base["falkordb"], block.replace("-", "_"), readiness_seconds=60,
            top={"gcs_block": gcs_block},
            extra={"corpus": {"root": ROOT / "examples" / "corpus", "floor": 250},
                   "training": {"recipe": recipe, "base_model": base["gguf"],
                                "model_cache": base["cache"], "serve_bucket": ""}})
        shutil.copy(ROOT / "examples" / "transcripts" / "education_1.md",
                    tmp / "docs" / "transcripts")
        self.install(path, base)
        return path
