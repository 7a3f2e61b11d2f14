"""`slm-nightly status` on local records: the newest summary, its age, the verdict."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from flows.cli import main
from tasks.night.summary import render_text
from tasks.records import ExtractionReport, RunSummary
from tasks.status import read_status, records_place, render
from tests.support.profiles import toml_profile

NOW = datetime(2026, 12, 1, 8, 30, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _no_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLM_YOYO_WEIGHTS_GCS_BUCKET", raising=False)


def _summary(status: str = "completed", finished: datetime = NOW - timedelta(hours=5.5),
             error: str | None = None) -> RunSummary:
    s = RunSummary(profile="tiny", status=status, started_at=(finished - timedelta(hours=2))
                   .isoformat(timespec="seconds"), finished_at=finished.isoformat(
                       timespec="seconds"), phases={}, extraction=ExtractionReport.empty().model_copy(
                       update={"llm_calls": 3, "prompt_tokens": 10, "completion_tokens": 5}))
    s.set_phase("extract", "completed" if status == "completed" else "failed", 12.5)
    if error:
        s.error = error
    return s


def _profile(tmp_path: Path, summary: RunSummary | None) -> Path:
    profile = toml_profile(tmp_path / "tiny.toml", state_dir=tmp_path / "state")
    if summary is not None:
        summary.save(tmp_path / "state" / "runs" / "last-run.json")
    return profile


def test_a_recent_completed_night_is_ok(tmp_path: Path) -> None:
    profile = _profile(tmp_path, _summary())
    st = read_status(records_place(str(profile)), now=NOW)
    assert not isinstance(st, str) and st.ok
    lines = render(st, "tiny").splitlines()
    assert lines[:3] == [f"run summary: {tmp_path / 'state' / 'runs' / 'last-run.json'}",
                         "finished 2026-12-01T03:00:00+00:00 (5.5 h ago)", ""]
    assert lines[3:-2] == render_text(st.summary, "tiny").splitlines()
    assert lines[3] == "slm-nightly run — profile tiny: COMPLETED"
    assert lines[-2:] == ["", "status: OK — the newest night ended completed 5.5 h ago"]


def test_a_failed_night_is_reported(tmp_path: Path) -> None:
    profile = _profile(tmp_path, _summary("failed", error="extract: PhaseFailed: 9 of 10"))
    st = read_status(records_place(str(profile)), now=NOW)
    assert not isinstance(st, str)
    assert render(st, "tiny").splitlines()[-1] == (
        "status: NOT OK — the newest night ended failed: extract: PhaseFailed: 9 of 10")


def test_an_old_night_is_reported_even_when_it_completed(tmp_path: Path) -> None:
    profile = _profile(tmp_path, _summary(finished=NOW - timedelta(hours=26, minutes=6)))
    st = read_status(records_place(str(profile)), now=NOW)
    assert not isinstance(st, str)
    assert st.problems == ["the newest night finished 26.1 h ago, more than 26 h: no night "
                           "has completed since"]
    assert render(st, "tiny").splitlines()[1] == "finished 2026-11-30T06:24:00+00:00 (26.1 h ago)"


def test_the_cli_exits_1_on_a_stale_or_failed_night_and_0_on_a_fresh_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = datetime.now(UTC)
    profile = _profile(tmp_path, _summary(finished=now - timedelta(hours=1)))
    assert main(["status", "--profile", str(profile)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(
        "status: OK — the newest night ended completed 1.0 h ago")
    _summary(finished=now - timedelta(hours=30)).save(tmp_path / "state" / "runs" /
                                                      "last-run.json")
    assert main(["status", "--profile", str(profile)]) == 1
    assert "more than 26 h" in capsys.readouterr().out.splitlines()[-1]
    assert main(["status", "--profile", str(profile), "--max-age-hours", "48"]) == 0
    capsys.readouterr()
    _summary("cancelled", finished=now).save(tmp_path / "state" / "runs" / "last-run.json")
    assert main(["status", "--profile", str(profile), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert (out["ok"], out["status"], out["problems"]) == (
        False, "cancelled", ["the newest night ended cancelled"])
    assert out["summary"]["phases"]["extract"]["seconds"] == 12.5


def test_no_summary_is_exit_1_with_where_it_looked(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    profile = _profile(tmp_path, None)
    assert main(["status", "--profile", str(profile)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"no run summary in {tmp_path / 'state' / 'runs' / 'last-run.json'}: no night has run "
        "on profile tiny")


def test_a_saved_bucket_block_without_a_prefect_api_says_what_to_do(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    profile = toml_profile(tmp_path / "gcp-like.toml", state_dir=tmp_path / "state",
                           gcs_block="slm-gcs")
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert main(["status", "--profile", str(profile)]) == 2
    assert capsys.readouterr().err.strip() == (
        "slm-nightly: status: the records bucket is the saved GcsBucket block 'slm-gcs' and "
        "PREFECT_API_URL is not set — set PREFECT_API_URL to the server it is saved on, or pass "
        "--bucket gs://BUCKET[/FOLDER] (application-default credentials)")
