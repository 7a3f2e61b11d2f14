"""The snapshot ledger (tasks/graph/snapshots.py): what it says of a graph's counts, and an
interrupted write told from damage."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.graph import falkordb_server
from tasks.graph import snapshots as snap


def test_ledger_states() -> None:
    assert snap.diff_counts({"nodes": {"A": 2}, "relationships": {"R": 1}},
                            {"nodes": {"A": 1, "B": 1}, "relationships": {}}) == \
        ["A 1 of 2", "B 1 of 0", "R 0 of 1"]


def test_an_interrupted_write_is_not_taken_for_damage(tmp_path: Path) -> None:
    ledger = snap.GraphCounts(tmp_path, "g")
    stats = {"nodes": {"A": 1}, "relationships": {}}
    assert ledger.check(stats)[0] == "unrecorded"
    ledger.record(stats)
    assert ledger.check(stats)[0] == "ok"
    assert ledger.check({"nodes": {"A": 2}, "relationships": {}})[0] == "damaged"
    ledger.begin_write("run-1")
    assert ledger.check({"nodes": {"A": 2}, "relationships": {}})[0] == "interrupted"
    ledger.record({"nodes": {"A": 2}, "relationships": {}})
    assert ledger.check({"nodes": {"A": 2}, "relationships": {}})[0] == "ok"
    assert snap.GraphCounts(tmp_path, "other graph").check(stats)[0] == "unrecorded"


def test_the_ledger_file_holds_only_the_keys_a_run_wrote(tmp_path: Path) -> None:
    import json

    ledger = snap.GraphCounts(tmp_path, "falkordb g")
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


# --- the snapshots' records (take itself, on a real server: tests/integration) -------------

META = {"name": "20261130T171532199664Z-b6872f83", "graph": "FalkorDB graph 'g'",
        "created_at": "2026-11-30T17:15:32+00:00", "run": "b6872f83-e0eb", "bytes": 36482,
        "sha256": "bf" * 32, "nodes": {"Person": 3}, "relationships": {"WORKS_FOR": 1}}


def _write(root: Path, name: str, text: str) -> Path:
    folder = root / snap.SNAPSHOTS / name
    folder.mkdir(parents=True)
    (folder / "snapshot.json").write_text(text)
    return folder


def test_snapshot_json_is_written_as_before_and_unreadable_ones_are_passed_over(
        tmp_path: Path) -> None:
    from tasks.records import GraphSnapshot

    text = GraphSnapshot.model_validate({**META, "path": "/elsewhere"}).meta()
    assert text == json.dumps(META, indent=2, sort_keys=True)  # the file before the record
    good = _write(tmp_path, META["name"], text)
    _write(tmp_path, "20261201T000000000000Z-broken", "{not json")
    _write(tmp_path, "20261202T000000000000Z-unknown", json.dumps({**META, "colour": "red"}))
    (found,) = snap.list_local(tmp_path)
    assert (found.name, found.path, found.counts()) == (
        META["name"], str(good), {"nodes": {"Person": 3}, "relationships": {"WORKS_FOR": 1}})
    assert found.model_dump() == {**META, "path": str(good)}  # no keys it was not given


def test_an_unchanged_graph_reuses_the_newest_snapshot_and_a_failure_is_reported(
        tmp_path: Path) -> None:
    from tasks.records import SnapshotFailed

    _write(tmp_path, META["name"], json.dumps(META))
    counts = {"nodes": {"Person": 3}, "relationships": {"WORKS_FOR": 1}}
    def write(folder: Path) -> Path:  # FalkorDB's, at a port where no server listens
        return falkordb_server.save_rdb(1, folder / "graph.rdb")

    snapshots = snap.SnapshotConfig(tmp_path, META["graph"], 2)
    kept = snap.keep_snapshot(snapshots, write, counts, "r", changed=False)
    assert kept is not None and not isinstance(kept, SnapshotFailed)
    assert (kept.name, kept.reused) == (META["name"], True)
    assert list(kept.model_dump())[-2:] == ["path", "reused"]
    assert snap.keep_snapshot(snapshots, None, counts, "r", True) is None
    assert snap.keep_snapshot(snap.SnapshotConfig(tmp_path, META["graph"], 0), write, counts, "r",
                              True) is None
    # other counts: a new one is taken, and the server is not there (port 1): reported
    failed = snap.keep_snapshot(snapshots, write, {**counts, "nodes": {"Person": 4}}, "r",
                                changed=False)
    assert isinstance(failed, SnapshotFailed) and failed.error.startswith("ConnectionError: ")
    assert snap.find(tmp_path, None).name == META["name"]  # the failure left the old one
