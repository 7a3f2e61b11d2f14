"""The snapshot ledger (tasks/graph/snapshots.py): what it says of a graph's counts, and an
interrupted write told from damage."""

from __future__ import annotations

from pathlib import Path

from tasks.graph import snapshots as snap


def test_ledger_states() -> None:
    assert snap.diff_counts({"nodes": {"A": 2}, "relationships": {"R": 1}},
                            {"nodes": {"A": 1, "B": 1}, "relationships": {}}) == \
        ["A 1 of 2", "B 1 of 0", "R 0 of 1"]


def test_an_interrupted_write_is_not_taken_for_damage(tmp_path: Path) -> None:
    ledger = snap.Ledger(tmp_path, "g")
    stats = {"nodes": {"A": 1}, "relationships": {}}
    assert ledger.check(stats)[0] == "unrecorded"
    ledger.record(stats)
    assert ledger.check(stats)[0] == "ok"
    assert ledger.check({"nodes": {"A": 2}, "relationships": {}})[0] == "damaged"
    ledger.begin_write("run-1")
    assert ledger.check({"nodes": {"A": 2}, "relationships": {}})[0] == "interrupted"
    ledger.record({"nodes": {"A": 2}, "relationships": {}})
    assert ledger.check({"nodes": {"A": 2}, "relationships": {}})[0] == "ok"
    assert snap.Ledger(tmp_path, "other graph").check(stats)[0] == "unrecorded"
