"""Teardown, always: the real nightly flow on a GceCompute profile against the fake Compute
Engine, in a separate process against a real `prefect server start`, with the fake vLLM made
slow so phase 1 is in progress when the run is

- cancelled through the Prefect API (`prefect flow-run cancel`) while a process worker runs it
  (on a two-node profile: both nodes are stopped),
- timed out (phase1_timeout_seconds),
- killed with -9, and the next nightly's start-up reaper stops the node it left up.

Each time the fake sees instances.stop for the node, the node ends TERMINATED and the `gpu`
slot is free. The flows and the worker import this checkout (PYTHONPATH); Google credentials
come the production way, Application Default Credentials (a service-account file whose
token_uri is the fake's)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tasks.shared.processes import free_port
from tests.fakes.compute_engine import FakeComputeEngine, FakeInstance
from tests.support.gce import PROJECT, SA, VLLM_NODE
from tests.support.paths import PREFECT, ROOT
from tests.support.prefect import prefect_server
from tests.support.profiles import toml_profile

LATENCY = 3.0  # seconds per LLM answer: 8 documents, one request at a time → phase 1 ≥ 24 s


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    # the repossessor frees expired leases every second instead of every 15 s (kill -9 case)
    with prefect_server(tmp_path_factory.mktemp("prefect") / "home",
                        PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS="1",
                        PREFECT_WORKER_QUERY_SECONDS="2",
                        PREFECT_LOGGING_LEVEL="WARNING") as env:
        yield env


class FakeEngineNodes:
    """The fake Compute Engine with one instance whose 'vLLM' is tests/fakes/openai_server.py (with
    `nodes` > 1, as many: node i ≥ 2 is the instance node-i, each VM on its own address)."""

    def __init__(self, tmp: Path, falkordb: int, graph: str, docs: int, nodes: int = 1) -> None:
        self.port = free_port()
        self.latency = LATENCY
        self.fake = FakeComputeEngine(PROJECT, on_start=self._vllm, agent_log=tmp / "agent.log")
        self.names = ["node", *(f"node-{i}" for i in range(2, nodes + 1))]
        for i, name in enumerate(self.names, 1):
            self.fake.add_instance("zone-a", name, boot_seconds=0.5,
                                   network_ip="127.0.0.1" if nodes == 1 else f"127.0.0.{i + 1}")
        sa = tmp / "sa.json"
        sa.write_text(json.dumps({**SA, "token_uri": self.fake.token_uri}))
        self.env = {"GOOGLE_APPLICATION_CREDENTIALS": str(sa)}
        src = tmp / "docs"
        for stream in ("transcripts", "research", "contacts"):
            (src / stream).mkdir(parents=True)
        for i in range(docs):
            (src / "transcripts" / f"t{i}.md").write_text(
                f"Ann Lee met Bob Stone and Cy Diaz on day {i}. Dee Fox took notes.")
        self.state = tmp / "state"
        self.profile = tmp / "gce.toml"
        toml_profile(
            self.profile, state_dir=self.state,
            compute={"type": "gce", "project": PROJECT, "zone": "zone-a", "instance": "node",
                     "api_endpoint": self.fake.url, "poll_seconds": 0.1, "nodes": nodes,
                     "boot_timeout_seconds": 30, "stop_timeout_seconds": 30,
                     "inference_port": self.port,
                     "node": VLLM_NODE},  # what the preflight's engine check accepts
            inference={"dialect": "vllm", "model": "fake", "max_concurrent_requests": 1,
                       "readiness_timeout_seconds": 30, "request_timeout_seconds": 60,
                       "context_tokens": 2048, "max_output_tokens": 256},
            graph={"type": "falkordb", "host": "127.0.0.1", "port": falkordb,
                   "graph_name": graph},
            sources={s: src / s for s in ("transcripts", "research", "contacts")},
            extraction={"max_failed_share": 1.0, "batch_documents": 1})

    def _vllm(self, inst: FakeInstance) -> list[str]:
        return [sys.executable, "-m", "tests.fakes.openai_server", "--port", str(self.port),
                "--host", inst.network_ip, "--latency", str(self.latency)]

    def __enter__(self) -> FakeEngineNodes:
        self.fake.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.fake.__exit__(*exc)

    def stops(self, name: str = "node") -> list[dict[str, Any]]:
        return self.fake.seen("stop", "zone-a", name)

    def summary(self) -> dict[str, Any]:
        return json.loads((self.state / "runs" / "last-run.json").read_text())


def api(env: dict[str, str], method: str, path: str, body: Any = None) -> Any:
    r = httpx.request(method, env["PREFECT_API_URL"] + path, json=body, timeout=10)
    r.raise_for_status()
    return r.json() if r.content else None


def gpu_slots(env: dict[str, str], name: str = "gpu") -> int:
    return int(api(env, "GET", f"/v2/concurrency_limits/{name}")["active_slots"])


def run_state(env: dict[str, str], run_id: str) -> str:
    return str(api(env, "GET", f"/flow_runs/{run_id}")["state"]["type"])


def wait_for(what: str, check: Callable[[], Any], timeout: float, proc: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"waiting for {what}: the process exited with {proc.returncode}")
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def extract_running(env: dict[str, str], parent_run: str | None = None) -> str | None:
    """Id of the nightly run whose phase-1 subflow is RUNNING (its parent), if any."""
    runs = api(env, "POST", "/flow_runs/filter", {
        "flows": {"name": {"any_": ["extract"]}},
        "flow_runs": {"state": {"type": {"any_": ["RUNNING"]}}}})
    for r in runs:
        task = r.get("parent_task_run_id")
        if not task:
            continue
        parent = api(env, "GET", f"/task_runs/{task}")["flow_run_id"]
        if parent_run in (None, parent):
            return str(parent)
    return None


def start_nightly(env: dict[str, str], node: FakeEngineNodes, log: Path, **params: Any) -> subprocess.Popen:
    """The nightly flow in its own Python process (the orchestrator), against the server."""
    code = ("import json, sys; from flows.nightly import nightly; "
            "nightly(**json.loads(sys.argv[1]))")
    return subprocess.Popen(
        [sys.executable, "-c", code, json.dumps({"profile": str(node.profile), **params})],
        cwd=ROOT, env={**env, **node.env}, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def prefect(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    proc = subprocess.run([PREFECT, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout[-2000:]}\n" \
                                 f"{proc.stderr[-2000:]}"
    return proc.stdout


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def test_cancel_mid_phase_1_stops_both_nodes(server: dict[str, str], tmp_path: Path,
                                             falkordb: int) -> None:
    """With nodes = 2 (the one-node case is the timeout's and kill -9's below)."""
    env = server
    with FakeEngineNodes(tmp_path, falkordb, "teardown_cancel", docs=8, nodes=2) as node:
        env = {**env, **node.env}
        prefect(env, "work-pool", "create", "local-process", "--type", "process")
        prefect(env, "--no-prompt", "deploy", "--name", "nightly/local")
        out = prefect(env, "deployment", "run", "nightly/local", "--param",
                      f"profile={node.profile}")
        run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out)
        assert run_id, out
        rid = run_id.group(1)
        log = tmp_path / "worker.log"
        worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "local-process",
                                   "--run-once"], cwd=ROOT, env=env, stdout=log.open("wb"),
                                  stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for("phase 1 of the deployed run", lambda: extract_running(env, rid), 90,
                     worker)
            for name in node.names:
                assert node.fake.instance("zone-a", name).status == "RUNNING"
                assert node.stops(name) == []
            assert gpu_slots(env) == 1
            cancelled_at = time.time()
            prefect(env, "flow-run", "cancel", rid)
            wait_for("state Cancelled", lambda: run_state(env, rid) == "CANCELLED", 60)
            # each stop was requested within the 30 s grace, by the run's own `finally`
            for name in node.names:
                assert node.stops(name) and node.stops(name)[0]["at"] - cancelled_at < 30, \
                    tail(log)
                assert node.fake.instance("zone-a", name).status == "TERMINATED"
            assert gpu_slots(env) == 0 and gpu_slots(env, "nightly") == 0
            s = node.summary()
            assert s["status"] == "cancelled", s.get("error")
            assert s["phases"]["extract"]["status"] == "cancelled"
            assert s["phases"]["compute_down"]["status"] == "completed"
            tokens_in = (s.get("extraction") or {}).get("prompt_tokens", 0)  # None: no report
            assert s["cost"]["gpu_hours"] > 0 and s["cost"]["tokens_in"] == tokens_in
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)  # our own worker's process group
                worker.wait(30)


def test_phase_1_out_of_budget_ends_partial_and_stops_the_node(
        server: dict[str, str], tmp_path: Path, falkordb: int) -> None:
    """Phase 1's budget (6 s) covers about two 3 s answers of 8: it ends `partial` on time —
    the night goes on, no longer failed by a timeout — and the node is stopped."""
    with FakeEngineNodes(tmp_path, falkordb, "teardown_timeout", docs=8) as node:
        log = tmp_path / "nightly.log"
        proc = start_nightly(server, node, log, phase1_timeout_seconds=6)
        try:
            assert proc.wait(120) == 0, tail(log)
        finally:
            if proc.poll() is None:
                proc.kill()
        s = node.summary()
        assert s["status"] == "partial", s.get("error")
        assert s["phases"]["extract"]["status"] == "partial", s.get("error")
        assert s["phases"]["extract"]["seconds"] < 9
        assert 0 < sum(s["extraction"]["pending"].values()) < 8
        assert s["phases"]["compute_down"]["status"] == "completed"
        assert len(node.stops()) == 1
        assert node.fake.instance("zone-a", "node").status == "TERMINATED"
        assert gpu_slots(server) == 0 and gpu_slots(server, "nightly") == 0
        assert s["cost"]["gpu_hours"] > 0


def test_kill_9_then_the_next_nightly_reaps_the_node(server: dict[str, str], tmp_path: Path,
                                                     falkordb: int) -> None:
    with FakeEngineNodes(tmp_path, falkordb, "teardown_kill", docs=8) as node:
        log = tmp_path / "killed.log"
        proc = start_nightly(server, node, log)
        try:
            dead = wait_for("phase 1 of the nightly", lambda: extract_running(server), 90, proc)
        finally:
            proc.send_signal(signal.SIGKILL)  # our own child, by PID
            proc.wait(10)
        killed_at = time.time()
        # nothing ran after the kill: node up, slots held, the run still RUNNING in the API
        assert node.fake.instance("zone-a", "node").status == "RUNNING" and node.stops() == []
        assert gpu_slots(server) == 1 and gpu_slots(server, "nightly") == 1
        assert run_state(server, dead) == "RUNNING"

        node.latency = 0.0  # the next run's node serves fast
        shutil.rmtree(node.state / "runs", ignore_errors=True)
        log2 = tmp_path / "next.log"
        nxt = start_nightly(server, node, log2)
        try:
            # it takes over the dead run's slots at once (same host, process gone: the lease is
            # released by id, the run marked Crashed), reaps the node it left up, runs as usual
            assert nxt.wait(240) == 0, tail(log2)
        finally:
            if nxt.poll() is None:
                nxt.kill()
        s = node.summary()
        assert s["status"] == "completed", s.get("error")
        reaped = s["reaper"]
        assert reaped["action"] == "stopped" and reaped["found"] == {"zone-a": "RUNNING"}
        assert "took over the 'nightly' slot from run" in log2.read_text(errors="replace")
        assert run_state(server, dead) == "CRASHED"
        stops = node.stops()
        starts = node.fake.seen("start", "zone-a", "node")
        # stopped by the reaper (after the kill, before this run's own start), then at the end
        assert len(stops) == 2 and len(starts) == 2
        assert killed_at < stops[0]["at"] < starts[1]["at"] < stops[1]["at"]
        assert node.fake.instance("zone-a", "node").status == "TERMINATED"
        assert gpu_slots(server) == 0 and gpu_slots(server, "nightly") == 0
