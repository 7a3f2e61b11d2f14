"""Records the tests start from."""

from __future__ import annotations

from typing import Any

from tasks.records import AdapterManifest, BaseRef


def manifest(name: str = "eng-1", state: str = "running", **kw: Any) -> AdapterManifest:
    m = AdapterManifest(name=name, bucket="engineering-pointsav", method="sft",
                        base=BaseRef(spec="x"), data_digest="d", run_digest="r", dataset="ds",
                        params={}, created="2026-11-30T00:00:00+00:00", created_by="test",
                        flow_run_id=kw.pop("flow_run_id", "run-1"), **kw)
    for s in ("starting", "preparing", "running", "done")[:("queued", "starting", "preparing",
                                                          "running", "done").index(state)]:
        m.advance(s)
    return m
