"""What the graph should hold, and copies of it.

The ledger (`<state_dir>/graph-ledger.json`) records, per graph, the node and relationship
counts a run left behind. At the next start the store is checked against it: a store that
came back smaller or different (FalkorDB truncates a damaged append-only file and starts
without a word) is reported with the way back instead of being written on. A run marks the
ledger "writing" before its first write and records the counts after its last, so a run
killed in between (whose unmarked documents the next run simply redoes) is not taken for
damage.

Snapshots are the embedded FalkorDB's RDB image (graph.rdb) or Neo4j's logical export
(graph.jsonl.gz, tasks/graph/export.py: Community can take it online), kept in the artifact
store under graph-snapshots/<name>/ with snapshot.json (the counts, the file and its sha256),
the newest `keep` locally, and copied to GCS when a bucket is configured. The file must hold the
counts the ledger records for the run, or no snapshot is kept. The incremental state lives in
the graph (Document nodes), so a restored graph and its state always agree.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.graph import falkordb_server
from tasks.records import GraphSnapshot, LedgerEntry, SnapshotFailed, SyncReport
from tasks.shared.errors import ConfigError, GraphError
from tasks.shared.files import file_sha256, write_atomic
from tasks.shared.gcs_sync import _full, _load, download_file, sync_folder

Stats = dict[str, dict[str, int]]
LEDGER = "graph-ledger.json"
SNAPSHOTS = "graph-snapshots"


class GraphDamaged(GraphError):
    """The store holds other counts than the last run left: data was lost at rest."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class GraphCounts:
    """The counts each graph should hold, in the profile's state folder."""

    def __init__(self, state_dir: Path, graph: str) -> None:
        self.path = Path(state_dir) / LEDGER
        self.graph = graph  # the block's description: kind, name and where its data lives

    def _all(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.path.read_text()))
        except (OSError, ValueError):
            return {}

    def entry(self) -> LedgerEntry | None:
        found = self._all().get(self.graph)
        return None if found is None else LedgerEntry.model_validate(found)

    def _put(self, entry: LedgerEntry) -> None:
        data = self._all()
        data[self.graph] = entry.model_dump(exclude_unset=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(data, indent=2, sort_keys=True))

    def begin_write(self, run: str | None = None) -> None:
        kept = self.entry() or LedgerEntry()
        self._put(LedgerEntry(**{**kept.model_dump(exclude_unset=True), "writing": True,
                                 "writer": run, "writing_since": _now()}))

    def record(self, stats: Stats, run: str | None = None, note: str = "") -> None:
        self._put(LedgerEntry(nodes=stats["nodes"], relationships=stats["relationships"],
                              recorded_at=_now(), run=run, writing=False,
                              **({"note": note} if note else {})))

    def check(self, stats: Stats) -> tuple[str, str]:
        """("ok" | "unrecorded" | "interrupted" | "damaged", message)."""
        entry = self.entry()
        if entry is None or entry.nodes is None:
            return "unrecorded", "no earlier run recorded this graph's counts"
        if entry.writing:
            return "interrupted", (f"the run of {entry.writing_since} stopped while "
                                   "writing; its unmarked documents are done again")
        diffs = diff_counts({"nodes": entry.nodes,
                             "relationships": entry.relationships or {}}, stats)
        if not diffs:
            return "ok", f"matches the counts recorded {entry.recorded_at}"
        return "damaged", (f"the graph does not hold what the run of {entry.recorded_at} "
                           f"left: {'; '.join(diffs[:8])}" + (" …" if len(diffs) > 8 else ""))


def diff_counts(expected: Stats, actual: Stats) -> list[str]:
    out = []
    for kind in ("nodes", "relationships"):
        want, got = expected.get(kind, {}), actual.get(kind, {})
        for k in sorted(set(want) | set(got)):
            if want.get(k, 0) != got.get(k, 0):
                out.append(f"{k} {got.get(k, 0)} of {want.get(k, 0)}")
    return out


# --- snapshots ---------------------------------------------------------------------------

def _read(meta: Path) -> GraphSnapshot:
    return GraphSnapshot.model_validate({**json.loads(meta.read_text()),
                                         "path": str(meta.parent)})


def list_local(root: Path) -> list[GraphSnapshot]:
    """Snapshots under <root>/graph-snapshots, newest first (an unreadable one is passed
    over)."""
    out = []
    for meta in sorted((Path(root) / SNAPSHOTS).glob("*/snapshot.json"), reverse=True):
        try:
            out.append(_read(meta))
        except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
            continue
    return out


def stamp() -> str:
    """Now, as snapshot names begin (they sort by age)."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


Writer = Callable[[Path], Path]  # writes the snapshot file into a folder; returns the file


@dataclass(frozen=True)
class SnapshotConfig:
    """Where a graph's snapshots are kept: the artifact store `root` (its graph-snapshots/),
    the graph they are of (GraphSettings.describe()), how many to keep (0: none are taken), and
    the GcsBucket block they are copied to, if any (the profile's Profile.snapshot_config)."""

    root: Path
    graph: str
    keep: int
    gcs_block: str | None = None


def take(snapshots: SnapshotConfig, write: Writer, stats: Stats, run: str | None = None) -> GraphSnapshot:
    """Snapshot the graph with `write` (tasks/graph/open.py snapshot_writer); keep the newest
    `snapshots.keep` locally; copy to GCS (artifacts/graph-snapshots/<name>/) when it names a
    GcsBucket block."""
    root, graph, keep, gcs_block = Path(snapshots.root), snapshots.graph, snapshots.keep, snapshots.gcs_block
    name = f"{stamp()}-{(run or 'adhoc')[:8]}"
    folder = root / SNAPSHOTS / name
    try:
        data = write(folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    result = GraphSnapshot(name=name, graph=graph, created_at=_now(), run=run,
                           bytes=data.stat().st_size, sha256=file_sha256(data),
                           nodes=stats["nodes"], relationships=stats["relationships"],
                           path=str(folder), file=data.name)
    write_atomic(folder / "snapshot.json", result.meta())
    for old in list_local(root)[keep:]:
        shutil.rmtree(old.path, ignore_errors=True)
    if gcs_block:
        prefix = f"artifacts/{SNAPSHOTS}/{name}"
        try:
            bucket = _load(gcs_block)
            report = sync_folder(folder, bucket, prefix=prefix)
        except Exception as e:  # noqa: BLE001 - the local snapshot stands; reported
            report = SyncReport.failed(e, limit=200)
        if report.error:
            result.gcs_error = report.error
        else:
            result.gcs = f"gs://{bucket.bucket}/{_full(bucket, prefix)}/{data.name}"
    return result


def _fetch_remote(root: Path, name: str | None, gcs_block: str) -> GraphSnapshot | None:
    """Download a snapshot (the newest when `name` is None) from GCS into `root`."""
    bucket = _load(gcs_block)
    prefix = _full(bucket, f"artifacts/{SNAPSHOTS}/")
    names = sorted({b.name[len(prefix):].split("/")[0] for b in
                    bucket.list_blobs(f"artifacts/{SNAPSHOTS}") if b.name.startswith(prefix)},
                   reverse=True)
    pick = name if name in names else (names[0] if names and name is None else None)
    if pick is None:
        return None
    folder = Path(root) / SNAPSHOTS / pick
    download_file(gcs_block, f"artifacts/{SNAPSHOTS}/{pick}/snapshot.json",
                  folder / "snapshot.json")
    found = _read(folder / "snapshot.json")
    download_file(gcs_block, f"artifacts/{SNAPSHOTS}/{pick}/{found.file}", folder / found.file)
    return found


def find(root: Path, name: str | None, gcs_block: str | None = None) -> GraphSnapshot:
    """The snapshot called `name` (the newest when None), locally or else from GCS."""
    local = list_local(root)
    hit = next((s for s in local if s.name == name), None) if name else \
        (local[0] if local else None)
    if hit is None and gcs_block:
        hit = _fetch_remote(root, name, gcs_block)
    if hit is None:
        known = [s.name for s in local][:10]
        raise ConfigError(f"graph snapshot {name or '(newest)'}: none in "
                          f"{Path(root) / SNAPSHOTS}" + (" or in GCS" if gcs_block else "") +
                          f" — known: {known or 'none'} (slm-nightly graph snapshots)")
    return hit


def verified(snap: GraphSnapshot) -> Path:
    """The snapshot's file, once its sha256 matches snapshot.json's."""
    data = Path(snap.path) / snap.file
    if not data.is_file():
        raise ConfigError(f"graph snapshot {snap.name}: {data} is missing")
    if file_sha256(data) != snap.sha256:
        raise GraphError(f"graph snapshot {snap.name}: {data} does not match its sha256 — "
                         "the copy is damaged; restore another (slm-nightly graph snapshots)")
    return data


def restore(data_dir: Path, snap: GraphSnapshot, load_timeout: float = 600.0) -> Path:
    """Put FalkorDB snapshot `snap` in place of the embedded graph's data folder (the server
    must be stopped). Checks the file's sha256 first; returns where the replaced folder was
    kept. (Neo4j's: tasks/graph/export.py replay.)"""
    if snap.file != "graph.rdb":
        raise ConfigError(f"graph snapshot {snap.name} is a {snap.file}, not FalkorDB's "
                          "graph.rdb — restore it into the Neo4j graph it was taken of")
    return falkordb_server.restore_rdb(Path(data_dir), verified(snap), load_timeout)


def keep_snapshot(snapshots: SnapshotConfig, write: Writer | None, stats: Stats, run: str | None,
                  changed: bool) -> GraphSnapshot | SnapshotFailed | None:
    """After a run: snapshot the graph when the run wrote to it (or none exists yet);
    otherwise name the newest one, which still holds the same graph. Never raises: a
    snapshot that fails is reported (the graph itself is intact)."""
    if snapshots.keep <= 0 or write is None:
        return None
    try:
        newest = list_local(snapshots.root)
        if newest and not changed and newest[0].graph == snapshots.graph and \
                not diff_counts(newest[0].counts(), stats):
            newest[0].reused = True  # (read from its file just now)
            return newest[0]
        return take(snapshots, write, stats, run)
    except Exception as e:  # noqa: BLE001
        return SnapshotFailed(error=f"{type(e).__name__}: {e}")


def damage_message(why: str, profile: str, snapshots: SnapshotConfig) -> str:
    """What was lost and the ways back, for a damaged graph."""
    ways = []
    if snapshots.keep > 0:
        local = list_local(snapshots.root)
        newest = f" (newest: {local[0].name}, {local[0].created_at})" if local else \
            (" (from GCS)" if snapshots.gcs_block else " (none kept yet)")
        ways.append(f"restore the last snapshot{newest}: slm-nightly graph restore "
                    f"--profile {profile}")
    ways.append(f"re-extract every document into it: slm-nightly run --profile {profile} "
                "--full (LLM calls for every document)")
    ways.append(f"if you changed the graph on purpose, accept it as it is: slm-nightly graph "
                f"accept --profile {profile}")
    return (f"graph check failed: {why}. Nothing was written tonight. Ways back: "
            + "; or ".join(ways))
