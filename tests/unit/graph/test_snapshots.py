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


def test_the_ledger_file_holds_only_the_keys_a_run_wrote(tmp_path: Path) -> None:
    import json

    ledger = snap.Ledger(tmp_path, "falkordb g")
    stats = {"nodes": {"Person": 3}, "relationships": {"KNOWS": 1}}
    ledger.record(stats, run="r1")
    entry = json.loads((tmp_path / snap.LEDGER).read_text())["falkordb g"]
    assert sorted(entry) == ["nodes", "recorded_at", "relationships", "run", "writing"]
    assert (entry["nodes"], entry["run"], entry["writing"]) == ({"Person": 3}, "r1", False)
    ledger.begin_write("r2")
    entry = json.loads((tmp_path / snap.LEDGER).read_text())["falkordb g"]
    assert sorted(entry) == ["nodes", "recorded_at", "relationships", "run", "writer",
                             "writing", "writing_since"]
    assert (entry["writer"], entry["writing"], entry["run"]) == ("r2", True, "r1")
    ledger.record(stats, note="restored")
    entry = json.loads((tmp_path / snap.LEDGER).read_text())["falkordb g"]
    assert "writer" not in entry and (entry["note"], entry["run"]) == ("restored", None)
    # a ledger written before the record reads the same; a broken file is no ledger
    (tmp_path / snap.LEDGER).write_text(json.dumps({"falkordb g": {
        "nodes": {"Person": 3}, "relationships": {"KNOWS": 1}, "recorded_at": "then",
        "run": None, "writing": False}}))
    assert ledger.check(stats) == ("ok", "matches the counts recorded then")
    (tmp_path / snap.LEDGER).write_text("{not json")
    assert ledger.check(stats)[0] == "unrecorded"
