"""Manifests that do not lie: the verdict for each way a run can be gone, and the owner check on
real processes (tasks/training/reconcile.py). The Prefect side runs against a real server in
tests/integration/test_reconcile.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tasks.records import Owner
from tasks.shared.errors import IllegalTransition
from tasks.training.reconcile import owner_gone, reconcile, this_process, verdict
from tests.support.records import manifest


@pytest.mark.parametrize("kind,new,words", [
    ("CRASHED", "failed", "crashed — the node was preempted or stopped, or the process was killed"),
    ("FAILED", "failed", "failed without updating the manifest"),
    ("CANCELLED", "cancelled", "was cancelled"),
    ("COMPLETED", "failed", "completed without finishing the job"),
])
def test_an_ended_flow_run_ends_its_job(kind: str, new: str, words: str) -> None:
    got = verdict(manifest(), (kind, "Instance preempted"), gone=False)
    assert got == (new, f"its flow run {words} (Instance preempted)")


def test_a_flow_run_missing_from_the_api_fails_its_job() -> None:
    assert verdict(manifest(flow_run_id="abc"), ("MISSING", ""), gone=False) == (
        "failed", "its flow run abc is not on the Prefect API (deleted, or recorded against "
        "another server)")


@pytest.mark.parametrize("kind", ["RUNNING", "PENDING", "SCHEDULED", "PAUSED", "CANCELLING"])
def test_a_live_flow_run_is_left_alone(kind: str) -> None:
    assert verdict(manifest(), (kind, ""), gone=False) is None
    assert verdict(manifest(), None, gone=False) is None  # no API: no verdict


def test_a_running_flow_run_whose_process_is_gone_fails_its_job() -> None:
    m = manifest(owner=Owner(host="h1", pid=4242, started=7))
    assert verdict(m, ("RUNNING", ""), gone=True) == (
        "failed", "its process 4242 on h1 is gone (killed or crashed) while the job was running")
    # No owner recorded (a manifest from before the field existed): only the API can tell.
    assert verdict(manifest(), ("RUNNING", ""), gone=True) is None


def test_owner_gone_on_real_processes() -> None:
    me = this_process()
    assert me.host == socket.gethostname() and me.pid == os.getpid() and me.started
    assert owner_gone(me) is False
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = Owner(host=me.host, pid=child.pid, started=None)
    child.wait()
    assert owner_gone(started) is True  # exited and reaped: no /proc entry
    # The pid now names another process (here: ours) started at another time.
    assert owner_gone(Owner(host=me.host, pid=me.pid, started=(me.started or 0) + 1)) is True
    # Another host's process is none of this host's business.
    assert owner_gone(Owner(host=me.host + "-other", pid=child.pid)) is False


def test_reconcile_marks_writes_and_skips_what_it_must() -> None:
    states = {"run-crashed": ("CRASHED", ""), "run-live": ("RUNNING", ""),
              "run-mine": ("CRASHED", ""), "run-cancelled": ("CANCELLED", "")}
    ms = [manifest("a", flow_run_id="run-crashed", steps=50, step=20),
          manifest("b", flow_run_id="run-live"),
          manifest("c", flow_run_id="run-mine"),  # the caller's own run
          manifest("d", state="done", flow_run_id="run-crashed"),  # final: never touched
          manifest("e", state="preparing", flow_run_id="run-cancelled"),
          manifest("f", state="queued", flow_run_id="")]  # nothing to ask, no owner
    written: list[str] = []
    out = reconcile(ms, lambda m: written.append(m.name), current_flow_run="run-mine",
                    read_state=lambda i: states[i], finished="2026-12-01T02:00:00+00:00")
    assert [(r.name, r.was, r.now) for r in out] == [("a", "running", "failed"),
                                                      ("e", "preparing", "cancelled")]
    assert written == ["a", "e"]
    assert ms[0].message == ("reconciled: its flow run crashed — the node was preempted or "
                             "stopped, or the process was killed; was running at step 20/50")
    assert ms[0].finished == "2026-12-01T02:00:00+00:00"
    assert [m.state for m in ms] == ["failed", "running", "running", "done", "cancelled", "queued"]
    with pytest.raises(IllegalTransition):  # and a reconciled job stays final
        ms[0].advance("running")


def test_reconcile_asks_the_owner_when_the_api_still_says_running() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # exited and reaped: the pid is gone
    host = socket.gethostname()
    dead = manifest("killed", flow_run_id="run-live", owner=Owner(host=host, pid=child.pid))
    alive = manifest("alive", flow_run_id="run-live", owner=this_process())
    out = reconcile([dead, alive], lambda m: None, read_state=lambda i: ("RUNNING", ""),
                    finished="2026-12-01T02:00:00+00:00")
    reason = f"its process {child.pid} on {host} is gone (killed or crashed) while the job was running"
    assert [(r.name, r.was, r.now, r.reason) for r in out] == [
        ("killed", "running", "failed", reason)]
    assert dead.message == f"reconciled: {reason}; was running"  # no step count known
    assert alive.state == "running"
