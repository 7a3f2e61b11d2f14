"""The node smoke's record (flows/smoke.py, `slm-nightly node smoke`): each phase as it ran, and
the verdict."""

from __future__ import annotations

from typing import Literal

from tasks.records.base import _Strict


class SmokePhase(_Strict):
    """One phase of the smoke: running until it ends, then ok or failed, in how long."""

    phase: str
    status: Literal["running", "ok", "failed"] = "running"
    detail: str = ""  # what it did; when it failed, the error
    seconds: float | None = None  # None while it runs


class SmokeResult(_Strict):
    """What `node_smoke` returns: it never raises for a failed phase, `error` says which."""

    phases: list[SmokePhase]
    verdict: Literal["passed", "failed"]
    error: str | None = None
