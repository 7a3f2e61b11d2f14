"""`slm-nightly status` from a shell with no local state: the newest summary in the bucket's
records/ (what the nightly's mirror_records copies there), through the GCS emulator."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from flows.cli import main
from tasks.records import RunSummary
from tasks.shared.gcs_sync import mirror_records
from tests.fakes.gcs import GcsEmulator
from tests.support.profiles import toml_profile


def test_status_reads_the_newest_summary_in_the_bucket(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    now = datetime.now(UTC)
    orchestrator = tmp_path / "orchestrator-state"
    runs = orchestrator / "runs"
    older = RunSummary(profile="gcp", status="completed", phases={},
                       finished_at=(now - timedelta(hours=25)).isoformat(timespec="seconds"))
    newer = RunSummary(profile="gcp", status="failed", phases={}, error="boot: NodeBootFailed",
                       finished_at=(now - timedelta(hours=1)).isoformat(timespec="seconds"))
    older.save(runs / "20261130T010000Z-aaaaaaaa.json")
    newer.save(runs / "20261201T010000Z-bbbbbbbb.json")
    older.save(runs / "last-run.json")  # not the newest: the names' UTC time decides
    (runs / "run-20261201T010000Z.log").write_text("a log, not a summary\n")
    with GcsEmulator(tmp_path) as gcs:
        for key, value in gcs.adc().items():
            monkeypatch.setenv(key, value)
        report = mirror_records(orchestrator, "gs://slm-corpus/nightly")
        assert report and report.error is None and report.uploaded == 4
        # another shell: its own, empty state_dir; the bucket named by the operators' variable;
        # a saved block that shell cannot load (status reads no block but the bucket's)
        monkeypatch.setenv("SLM_YOYO_WEIGHTS_GCS_BUCKET", "gs://slm-corpus/nightly")
        profile = toml_profile(tmp_path / "gcp-like.toml", state_dir=tmp_path / "empty-state",
                               graph={"block": "no-such-block"})
        assert main(["status", "--profile", str(profile)]) == 1
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == ("run summary: "
                            "gs://slm-corpus/nightly/records/runs/20261201T010000Z-bbbbbbbb.json")
        assert lines[1].endswith("(1.0 h ago)")
        assert lines[3] == "slm-nightly run — profile gcp: FAILED"
        assert lines[-1] == ("status: NOT OK — the newest night ended failed: "
                             "boot: NodeBootFailed")
        assert main(["status", "--profile", str(profile), "--bucket",
                     "gs://slm-corpus/elsewhere"]) == 1
        assert capsys.readouterr().err.strip() == (
            "no run summary in gs://slm-corpus/elsewhere (records/runs/): no night has run on "
            "profile gcp-like")


@pytest.mark.usefixtures("prefect_api")
def test_status_reads_through_the_profiles_saved_gcs_bucket_block(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLM_YOYO_WEIGHTS_GCS_BUCKET", raising=False)
    night = RunSummary(profile="gcp", status="partial", phases={},
                       finished_at=datetime.now(UTC).isoformat(timespec="seconds"))
    night.save(tmp_path / "orchestrator" / "runs" / "20261201T010000Z-cccccccc.json")
    with GcsEmulator(tmp_path) as gcs:
        gcs.bucket(folder="prod").save("test-records", overwrite=True)
        records = mirror_records(tmp_path / "orchestrator", "test-records")
        assert records is not None and records.error is None
        profile = toml_profile(tmp_path / "gcp-like.toml", state_dir=tmp_path / "empty",
                               gcs_block="test-records")
        assert main(["status", "--profile", str(profile)]) == 0
        lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "run summary: gs://slm-corpus/prod/records/runs/20261201T010000Z-cccccccc.json"
    assert lines[-1] == "status: OK — the newest night ended partial 0.0 h ago"
