"""The node smoke's phases as they run (tasks/night/smoke.py Smoke): what it says at each
start and end, and the records the flow returns (the smoke itself, on the fake node:
tests/integration/test_node_preflight.py)."""

from __future__ import annotations

import pytest

from tasks.night.smoke import Smoke
from tasks.records import SmokeResult


def test_each_phase_is_told_and_recorded_and_a_failure_keeps_its_error() -> None:
    said: list[str] = []
    smoke = Smoke(said.append)
    with smoke.phase("boot") as p:
        assert (p.status, p.seconds) == ("running", None)
        p.detail = "up in us-central1-a"
    with pytest.raises(RuntimeError), smoke.phase("engine"):
        raise RuntimeError("no answer on :9080")
    with smoke.phase("stop"):
        pass
    boot, engine, stop = smoke.phases
    assert (boot.status, boot.detail) == ("ok", "up in us-central1-a")
    assert (engine.status, engine.detail) == ("failed", "RuntimeError: no answer on :9080")
    assert (stop.status, stop.detail) == ("ok", "")
    assert all(p.seconds is not None and 0 <= p.seconds < 1 for p in smoke.phases)
    assert said == ["smoke: boot …", f"smoke: boot ok ({boot.seconds} s): up in us-central1-a",
                    "smoke: engine …",
                    f"smoke: engine failed ({engine.seconds} s): RuntimeError: no answer on "
                    ":9080",
                    "smoke: stop …", f"smoke: stop ok ({stop.seconds} s)"]
    result = SmokeResult(phases=smoke.phases, verdict="failed", error="RuntimeError: x")
    assert result.model_dump()["phases"][1] == {
        "phase": "engine", "status": "failed", "detail": "RuntimeError: no answer on :9080",
        "seconds": engine.seconds}
    with pytest.raises(ValueError, match="status"):
        boot.status = "fine"  # type: ignore[assignment]
