"""Ctrl-C, SIGTERM and kill -9 on `slm-nightly run`, as people do them: the real CLI as a
terminal job (its own session and process group), with its own PREFECT_HOME and no
PREFECT_API_URL — so it uses a temporary Prefect server, as `make run` does — the real llama.cpp
server (SmolLM2-135M) and an embedded FalkorDB under tmp.

The take-over rules are also checked on their own, against the session's Prefect test
server: a killed holder's lease is released by id; a live holder, or one on another host, is
never touched.

Bounds: a first signal stops the run "within seconds". What it waits for: stopping the
llama.cpp server (SIGTERM, then SIGKILL after 5 s), the flow unwinding (a few API calls to a
local server), the summary, and the temporary Prefect server (SIGTERM; SIGKILL after 5 s).
Measured 4–8 s on the 2-core machine under load; EXIT_BOUND (30 s) is Prefect's own grace for
a cancelled run before it is killed. A second signal skips the unwinding: AT_ONCE_BOUND.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tasks.shared.processes import ManagedServer, alive
from tests.support.prefect import seeded
from tests.support.profiles import toml_profile

SLM = str(Path(sys.executable).parent / "slm-nightly")
DOCS = 3
EXIT_BOUND = 30.0
AT_ONCE_BOUND = 15.0
RUN_TIMEOUT = 420.0
PEOPLE = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov"]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One PREFECT_HOME for the module's runs, its database already migrated."""
    return seeded(tmp_path_factory.mktemp("prefect-home"))


def write_profile(tmp: Path) -> Path:
    """A local profile: llama.cpp, embedded FalkorDB under tmp, DOCS short research notes (one
    LLM call each, one per batch, so documents are recorded one by one), no training."""
    notes = tmp / "docs" / "research"
    notes.mkdir(parents=True)
    for s in ("transcripts", "contacts"):
        (tmp / "docs" / s).mkdir()
    for i in range(DOCS):
        p = PEOPLE[i]
        (notes / f"note-{i}.md").write_text(
            f"# Note {i}\n\n{p} met the Berkeley Meeting Recorder group on day {i}. {p} works for "
            f"the International Computer Science Institute and decided to fund project {i}.\n")
    path = tmp / "local.toml"
    toml_profile(path, state_dir=tmp / "state",
                 # two OpenMP threads crawl when anything else takes one of the 2 cores
                 compute={"type": "local", "n_threads": 1},
                 inference={"dialect": "llama.cpp", "model": "SmolLM2-135M-Instruct",
                            "repeat_penalty": 1.1,  # as profiles/local.toml: SmolLM2 loops
                            "max_concurrent_requests": 1, "max_output_tokens": 256,
                            "max_entities": 4, "max_relationships": 3,
                            "max_description_chars": 32, "readiness_timeout_seconds": 120,
                            "max_retries": 1},
                 graph={"type": "falkordb", "data_dir": tmp / "graph"},
                 sources={"transcripts": tmp / "docs" / "transcripts", "research": notes,
                          "contacts": tmp / "docs" / "contacts"},
                 extraction={"max_failed_share": 1.0, "batch_documents": 1},
                 training={"enabled": False})
    return path


class Run:
    """One `slm-nightly run` as a terminal job; every descendant it starts is collected while
    it runs (they must all be gone when it ends)."""

    def __init__(self, tmp: Path, home: Path, name: str) -> None:
        self.tmp, self.log = tmp, tmp / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env.update(PREFECT_HOME=str(home), PREFECT_LOGGING_LEVEL="INFO")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([SLM, "run", "--profile", str(tmp / "local.toml")],
                                         stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self.seen: dict[int, str] = {}

    def watch(self) -> None:
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return
        for p in children:
            try:  # read again each time: a child caught between fork and exec shows its parent's
                self.seen[p.pid] = " ".join(p.cmdline())[:120] or self.seen.get(p.pid, "")
            except psutil.Error:
                pass

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            self.watch()
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"no {text!r} in {timeout} s:\n{self.output()[-3000:]}"
            time.sleep(0.2)
        self.watch()

    def wait(self, timeout: float) -> tuple[int, float]:
        """Exit code and seconds it took; fails the test after `timeout`."""
        start = time.monotonic()
        while self.proc.poll() is None:
            self.watch()
            assert time.monotonic() - start < timeout, \
                f"still running {timeout} s later:\n{self.output()[-3000:]}"
            time.sleep(0.1)
        return self.proc.returncode, time.monotonic() - start

    def survivors(self) -> dict[int, str]:
        return {pid: cmd for pid, cmd in self.seen.items() if alive(pid)}

    def kill_all(self) -> None:
        """Test cleanup only: what this run started, by PID."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.survivors():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def server_pid(tmp: Path, name: str) -> int:
    where = tmp / "state" if name == "inference" else (tmp / "graph").resolve()
    rec = ManagedServer(name, where).running()
    assert rec is not None, f"{name} is not running"
    return rec.pid


def summary(tmp: Path) -> dict[str, Any]:
    return dict(json.loads((tmp / "state" / "runs" / "last-run.json").read_text()))


def recorded(tmp: Path) -> tuple[set[str], set[str]]:
    """Documents the graph records as extracted, and as failed."""
    from tasks.graph.open import open_graph
    from tasks.profile import load_profile

    with open_graph(load_profile(str(tmp / "local.toml")).graph) as store:
        states = store.document_states()
    return ({i for i, s in states.items() if s.get("hash")},
            {i for i, s in states.items() if s.get("failed_hash")})


def interrupted(tmp: Path, home: Path, name: str) -> tuple[Run, int, int]:
    """A run that has recorded its first document and is extracting the next ones; the PIDs
    of its llama.cpp server and FalkorDB."""
    run = Run(tmp, home, name)
    try:
        run.wait_for("batch 1/")
        return run, server_pid(tmp, "inference"), server_pid(tmp, "falkordb")
    except BaseException:
        run.kill_all()
        raise


def assert_all_stopped(run: Run, *pids: int) -> None:
    for pid in pids:
        assert not alive(pid), f"pid {pid} survived the run"
    assert len(run.seen) >= 3  # llama.cpp, FalkorDB, the temporary Prefect server at least
    assert run.survivors() == {}, run.survivors()


def test_ctrl_c_stops_the_run_and_the_next_run_redoes_only_what_was_not_recorded(
        tmp_path: Path, home: Path) -> None:
    write_profile(tmp_path)
    run, llama, graph = interrupted(tmp_path, home, "first")
    try:
        os.killpg(run.proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        code, seconds = run.wait(EXIT_BOUND)
        print(f"SIGINT → exit {code} in {seconds:.1f} s")
        out = run.output()
        assert code == 130, out[-3000:]
        assert f"stopped the inference server (llama.cpp), pid {llama}" in out
        assert f"stopped the embedded FalkorDB, pid {graph}" in out
        assert "run stopped by SIGINT" in out and "stopped the temporary Prefect server" in out
        assert_all_stopped(run, llama, graph)
    finally:
        run.kill_all()
    s = summary(tmp_path)
    assert s["status"] == "cancelled" and s["phases"]["extract"]["status"] == "cancelled"
    assert s["phases"]["compute_down"]["status"] == "completed"
    done, failed = recorded(tmp_path)
    assert 1 <= len(done | failed) < DOCS, (done, failed)

    again = Run(tmp_path, home, "again")
    try:
        code, _ = again.wait(RUN_TIMEOUT)
        assert code == 0, again.output()[-3000:]
        assert "took over" not in again.output()  # the interrupted run gave its slots back
    finally:
        again.kill_all()
    s = summary(tmp_path)
    docs = s["extraction"]["documents"]["research"]
    assert docs["seen"] == DOCS and docs["skipped"] == len(done)
    assert docs["extracted"] + docs["failed"] == DOCS - len(done)
    assert s["extraction"]["llm_calls"] >= DOCS - len(done | failed)  # held failures make no call
    done_now, failed_now = recorded(tmp_path)
    assert done <= done_now and len(done_now | failed_now) == DOCS


def test_sigterm_stops_the_run(tmp_path: Path, home: Path) -> None:
    write_profile(tmp_path)
    run, llama, graph = interrupted(tmp_path, home, "first")
    try:
        run.proc.send_signal(signal.SIGTERM)  # `kill PID`, as a service manager does
        code, seconds = run.wait(EXIT_BOUND)
        print(f"SIGTERM → exit {code} in {seconds:.1f} s")
        out = run.output()
        assert code == 143, out[-3000:]
        assert "run stopped by SIGTERM" in out and "stopped the temporary Prefect server" in out
        assert_all_stopped(run, llama, graph)
    finally:
        run.kill_all()
    s = summary(tmp_path)
    assert s["status"] == "cancelled" and s["phases"]["extract"]["status"] == "cancelled"


def test_a_second_ctrl_c_exits_at_once(tmp_path: Path, home: Path) -> None:
    write_profile(tmp_path)
    run, llama, graph = interrupted(tmp_path, home, "first")
    prefect = next(pid for pid, cmd in run.seen.items() if "uvicorn" in cmd)
    try:
        os.killpg(run.proc.pid, signal.SIGINT)
        time.sleep(0.5)
        os.killpg(run.proc.pid, signal.SIGINT)
        code, seconds = run.wait(AT_ONCE_BOUND)
        print(f"second SIGINT → exit {code} in {seconds:.1f} s")
        out = run.output()
        assert code == 130, out[-3000:]
        assert "SIGINT again: stopping the servers and exiting now" in out
        assert "run stopped by SIGINT" not in out  # it did not wait for the run to unwind
        assert_all_stopped(run, llama, graph, prefect)
    finally:
        run.kill_all()


def test_kill_9_mid_extraction_then_the_next_run_takes_over_and_completes(
        tmp_path: Path, home: Path) -> None:
    write_profile(tmp_path)
    run, llama, graph = interrupted(tmp_path, home, "killed")
    try:
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait(10)
        held = sorted(p.name.split(".")[0] for p in (home / "slm-nightly" / "slots").glob("*.json"))
        assert held == ["gpu", "nightly"]  # nothing ran after the kill: both still recorded
        left = run.survivors()  # its servers live in their own sessions: nobody stopped them
        assert llama in left and graph in left

        nxt = Run(tmp_path, home, "next")
        try:
            code, _ = nxt.wait(RUN_TIMEOUT)
            out = nxt.output()
            assert code == 0, out[-3000:]
        finally:
            nxt.kill_all()
        for limit in ("nightly", "gpu"):
            assert f"took over the '{limit}' slot from run" in out and "its process is gone" in out
        assert f"stopped the embedded FalkorDB, pid {graph}, left running by a killed run" in out
        assert "stopped a temporary Prefect server left running by a killed run" in out
        assert run.survivors() == {} and nxt.survivors() == {}
        assert list((home / "slm-nightly" / "slots").glob("*.json")) == []
        assert summary(tmp_path)["status"] == "completed"
    finally:
        run.kill_all()


HOLD = """
import sys, time
from tasks.shared.slots import nightly_slot

with nightly_slot(timeout_seconds=30):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The slot records in a PREFECT_HOME of the test's own (this process and its children)."""
    import tasks.shared.slots

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(tasks.shared.slots, "_records", lambda: tmp_path / "home" / "slm-nightly" / "slots")
    return tmp_path / "home" / "slm-nightly" / "slots"


@pytest.mark.usefixtures("prefect_api")
def test_a_killed_holders_lease_is_released_by_id(slots: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    from tasks.shared.slots import active_slots, take_over_dead_holders

    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())})
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert take_over_dead_holders("nightly") == []  # alive: never taken over
        assert active_slots("nightly") == 1
    finally:
        holder.kill()  # -9: it releases nothing
        holder.wait()
    assert active_slots("nightly") == 1
    [said] = take_over_dead_holders("nightly")
    assert f"pid {holder.pid}" in said and "its process is gone; released its lease" in said
    assert active_slots("nightly") == 0 and list(slots.glob("*.json")) == []


@pytest.mark.usefixtures("prefect_api")
def test_a_holder_on_another_host_is_never_taken_over(slots: Path) -> None:
    from tasks.shared.slots import active_slots, nightly_slot, take_over_dead_holders

    with nightly_slot(timeout_seconds=30):
        [mine] = slots.glob("nightly.*.json")
        rec = json.loads(mine.read_text())
        elsewhere = slots / "nightly.00000000-0000-0000-0000-000000000001.json"
        # its PID runs nowhere here (above Linux's largest pid_max): only the host says "keep"
        elsewhere.write_text(json.dumps({**rec, "hostname": "another-host", "pid": 4_194_305}))
        assert take_over_dead_holders("nightly") == []
        assert elsewhere.exists() and active_slots("nightly") == 1
        elsewhere.unlink()
    assert active_slots("nightly") == 0 and list(slots.glob("*.json")) == []


@pytest.mark.usefixtures("prefect_api")
def test_a_holder_keeps_its_record_until_its_lease_is_released(
        slots: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second Ctrl-C exits at once, maybe while the first one's unwinding releases the gpu
    slot; a release can also fail when the run's temporary server is gone. Either way the
    record must still be there for the next run to take over: forgotten first, the slot stayed
    counted with nobody recorded, and the next night waited for it forever (seen on 3 workers:
    test_kill_9_mid_extraction_… after test_a_second_ctrl_c_exits_at_once)."""
    import httpx
    import prefect.concurrency._sync as prefect_sync

    from tasks.shared.slots import active_slots, gpu_slot, take_over_dead_holders

    release = prefect_sync.release_concurrency_slots_with_lease
    records_at_release: list[list[str]] = []

    def watched(lease_id: Any) -> None:
        records_at_release.append(sorted(p.name for p in slots.glob("gpu.*.json")))
        release(lease_id)

    monkeypatch.setattr(prefect_sync, "release_concurrency_slots_with_lease", watched)
    with gpu_slot(timeout_seconds=30):
        [record] = slots.glob("gpu.*.json")
    assert records_at_release == [[record.name]]  # still recorded while it was released
    assert not record.exists() and active_slots("gpu") == 0

    def server_gone(lease_id: Any) -> None:
        raise httpx.ConnectError("All connection attempts failed")

    monkeypatch.setattr(prefect_sync, "release_concurrency_slots_with_lease", server_gone)
    with pytest.raises(httpx.ConnectError), gpu_slot(timeout_seconds=30):
        [record] = slots.glob("gpu.*.json")
    # left for the next taker (here, where the server still answers, Prefect's own context
    # released the lease on its way out)
    assert record.exists() and active_slots("gpu") == 0
    # that taker, once the holder is gone, finds the lease released and gives nothing back
    record.write_text(json.dumps({**json.loads(record.read_text()), "pid": 4_194_305}))
    assert take_over_dead_holders("gpu") == [] and not record.exists()
    assert active_slots("gpu") == 0
