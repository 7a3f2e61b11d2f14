"""The nightly flow with the GCE node: the fake Compute Engine boots the 'node', whose startup
agent is the fake OpenAI server (standing in for vLLM), real FalkorDB, Prefect test server."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from blocks.gce import GceCompute
from flows.nightly import nightly
from tasks.night.summary import render_markdown, render_text
from tasks.records import RunSummary
from tasks.shared.processes import free_port
from tests.fakes.compute_engine import FakeComputeEngine, FakeInstance
from tests.support.gce import PROJECT, VLLM_NODE, creds, gce_profile
from tests.support.paths import ROOT

pytestmark = pytest.mark.usefixtures("prefect_api")


def test_nightly_boots_uses_and_stops_the_gce_node(tmp_path: Path, falkordb: int) -> None:
    port = free_port()

    def vllm(inst: FakeInstance) -> list[str]:
        return [sys.executable, "-m", "tests.fakes.openai_server", "--port", str(port)]

    profile = gce_profile(tmp_path, "nightly-gce-node", falkordb, "nightly_gce")
    shutil.copy(ROOT / "examples" / "transcripts" / "education_1.md", tmp_path / "docs" /
                "transcripts")
    with FakeComputeEngine(PROJECT, on_start=vllm, agent_log=tmp_path / "agent.log") as fake:
        fake.add_instance("zone-a", "node")
        fake.add_instance("zone-b", "node")
        fake.stock_out("zone-a", "SPOT")
        GceCompute(project=PROJECT, zone="zone-a", instance="node", fallback_zones=["zone-b"],
                   api_endpoint=fake.url, gcp_credentials=creds(fake), poll_seconds=0.1,
                   inference_port=port, state_dir=str(tmp_path / "state"), node=VLLM_NODE
                   ).save("nightly-gce-node", overwrite=True)
        s = nightly(profile=str(profile)).to_dict()
        assert s["status"] == "completed", s.get("error")
        assert s["node"].startswith("GCE test-project/zone-b/node (spot, g2-standard-4)")
        assert "zone-a spot: stocked out" in s["node"]
        assert s["extraction"]["documents"]["transcripts"]["seen"] == 1
        assert {k: v["status"] for k, v in s["phases"].items()}["inference_down"] == "completed"
        assert fake.instance("zone-b", "node").status == "TERMINATED"
        assert fake.instance("zone-b", "node").metadata["slm-engine"] == "stopped"
        # Compute would stop it by itself after the night's budget: boot 600 + readiness 30 +
        # phases 7200 + 7200 + stop 300 + margin 1800 (tasks/night/clock.py night_budget)
        assert fake.instance("zone-b", "node").max_run_seconds == 17130
        assert not fake.agent_running("zone-b", "node")
        assert len(fake.seen("stop", "zone-b", "node")) == 1
        assert s["reaper"]["action"] == "none" and s["reaper"]["found"] == {}
        # cost: the node's RUNNING time on the fake × the block's spot rate; tokens from usage
        cost = s["cost"]
        ran = fake.running_seconds("zone-b", "node")
        assert cost["running_seconds"] == pytest.approx(ran, abs=0.5) and ran > 0
        assert cost["gpu_hours"] == pytest.approx(cost["running_seconds"] / 3600, rel=1e-3)
        assert cost["estimated_usd"] == pytest.approx(cost["running_seconds"] / 3600 * 0.28, abs=1e-6)
        assert cost["rates"] == ["spot $0.28/h"] and list(cost["zones"]) == ["zone-b"]
        assert cost["tokens_in"] == s["extraction"]["prompt_tokens"] > 0
        assert cost["tokens_out"] == s["extraction"]["completion_tokens"] > 0
        record = RunSummary.parse(s, "the run summary")
        text, md = render_text(record), render_markdown(record)
        line = f"Cost: {cost['gpu_hours']:.4f} GPU-hours at spot $0.28/h ≈ $"
        assert line in text and line in md
        x = s["extraction"]
        assert f"tokens in {x['prompt_tokens']} / out {x['completion_tokens']}" in text


def test_a_node_preempted_during_phase1_fails_it_as_preempted_and_loses_no_document(
        tmp_path: Path, falkordb: int) -> None:
    """The 'vLLM' answers in 1 s per request; the node is preempted after its third answer.
    The phase ends `preempted` (not a pile of document errors), the node is left stopped, and
    the documents it could not do are dead-lettered but not held: the next run does them."""
    import json
    import threading
    import time

    from tasks.shared.errors import NodePreempted

    port = free_port()
    answered = tmp_path / "answered.log"

    def vllm(inst: FakeInstance) -> list[str]:
        return [sys.executable, "-m", "tests.fakes.openai_server", "--port", str(port), "--latency", "1",
                "--answered-log", str(answered)]

    profile = gce_profile(tmp_path, "nightly-gce-preempt", falkordb, "nightly_gce_preempt",
                          inference={"max_concurrent_requests": 1, "max_retries": 1,
                                     "retry_base_seconds": 0.05},
                          extra={"extraction": {"max_failed_share": 1.0}})
    for i in range(12):
        (tmp_path / "docs" / "transcripts" / f"t{i}.md").write_text(
            f"Ann Lee met Bob Stone on day {i}.")
    with FakeComputeEngine(PROJECT, on_start=vllm, agent_log=tmp_path / "agent.log") as fake:
        fake.add_instance("zone-a", "node")
        GceCompute(project=PROJECT, zone="zone-a", instance="node", api_endpoint=fake.url,
                   gcp_credentials=creds(fake), poll_seconds=0.1, inference_port=port,
                   state_dir=str(tmp_path / "state"), node=VLLM_NODE
                   ).save("nightly-gce-preempt", overwrite=True)
        def preempt_mid_phase1() -> None:  # after three answers: some documents done, most not
            while len(answered.read_text().splitlines() if answered.exists() else []) < 3:
                time.sleep(0.05)
            fake.preempt("zone-a", "node")

        threading.Thread(target=preempt_mid_phase1, daemon=True).start()
        with pytest.raises(NodePreempted, match="spot preemption at"):
            nightly(profile=str(profile))
        s = json.loads((tmp_path / "state" / "runs" / "last-run.json").read_text())
        assert s["status"] == "preempted" and s["phases"]["extract"]["status"] == "preempted"
        assert "inference_down" not in s["phases"]
        done = s["extraction"]["documents"]["transcripts"]["extracted"]
        failed = [f for f in s["extraction"]["failures"] if f["error"] == "LLMError"]
        assert 0 < done < 12 and len(failed) == 12 - done
        assert all("retried on the next run" in f["message"] for f in failed)
        assert fake.instance("zone-a", "node").status == "TERMINATED"
        assert not fake.agent_running("zone-a", "node")
        # the next night (the node comes back): the rest is done, no --retry-failed needed
        s2 = nightly(profile=str(profile)).to_dict()
        assert s2["status"] == "completed", s2.get("error")
        assert s2["extraction"]["documents"]["transcripts"] == {"seen": 12, "extracted": 12 - done,
                                                 "skipped": done, "failed": 0}
