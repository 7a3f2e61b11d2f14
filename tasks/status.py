"""`slm-nightly status`: the newest night's run summary, its age, and whether it is healthy.

With a bucket for the profile's run records (`gcs_block`, else SLM_YOYO_WEIGHTS_GCS_BUCKET),
the summary is the newest `records/runs/<UTC time>-<run>.json` there (the nightly mirrors its
records at its end: tasks/night/stages.py _write_summary, tasks/shared/gcs_sync.py mirror_records), so any
shell with read access to the bucket sees what the orchestrator's night did. Without one, it
is `<state_dir>/runs/last-run.json`. A night is healthy when it ended `completed` or `partial`
and finished less than `max_age_hours` (26) ago.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect.settings import PREFECT_API_URL

from tasks.night.summary import render_text
from tasks.profile import load_profile, profile_path, project_path
from tasks.records import RunSummary
from tasks.shared.errors import ConfigError, RecordError
from tasks.shared.gcs_sync import GcsFolder, env_bucket, gcs_bucket_from_env_or_block, parse_bucket_url

MAX_AGE_HOURS = 26.0
HEALTHY = ("completed", "partial")
# tasks/night/stages.py _write_summary: runs/20261201T010203Z-1a2b3c4d.json
SUMMARY_NAME = re.compile(r"\d{8}T\d{6}Z-[^/]+\.json")


@dataclass
class Status:
    source: str  # where the summary was read
    summary: RunSummary
    finished: datetime | None  # finished_at, else started_at; None: neither recorded
    age_hours: float | None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "status": self.summary.status,
                "finished_at": self.finished.isoformat() if self.finished else None,
                "age_hours": None if self.age_hours is None else round(self.age_hours, 2),
                "ok": self.ok, "problems": self.problems, "summary": self.summary.to_dict()}


def _when(s: RunSummary) -> datetime | None:
    for value in (s.finished_at, s.started_at):
        if value:
            t = datetime.fromisoformat(value)
            return t if t.tzinfo else t.replace(tzinfo=UTC)
    return None


def judge(source: str, summary: RunSummary, now: datetime,
          max_age_hours: float = MAX_AGE_HOURS) -> Status:
    finished = _when(summary)
    age = None if finished is None else (now - finished).total_seconds() / 3600
    problems = []
    if summary.status not in HEALTHY:
        problems.append(f"the newest night ended {summary.status}"
                        + (f": {summary.error}" if summary.error else ""))
    if age is None:
        problems.append("the summary records no finish time")
    elif age > max_age_hours:
        problems.append(f"the newest night finished {age:.1f} h ago, more than "
                        f"{max_age_hours:g} h: no night has completed since")
    return Status(source, summary, finished, age, problems)


def newest_local(state_dir: Path) -> tuple[str, RunSummary] | None:
    last = state_dir / "runs" / "last-run.json"
    if not last.is_file():
        return None
    return str(last), RunSummary.load(last)


def newest_in_bucket(block: str) -> tuple[str, RunSummary] | None:
    """The newest run summary under gs://…/records/runs/ (by its UTC-time name), else
    records/runs/last-run.json there."""
    if not block.startswith("gs://"):  # a saved GcsBucket block: it lives on the Prefect server
        fix = ("set PREFECT_API_URL to the server it is saved on, or pass --bucket "
               "gs://BUCKET[/FOLDER] (application-default credentials)")
        if not PREFECT_API_URL.value():
            raise ConfigError(f"status: the records bucket is the saved GcsBucket block "
                              f"{block!r} and PREFECT_API_URL is not set — {fix}")
        try:
            bucket = gcs_bucket_from_env_or_block(block)
        except ValueError as e:  # Prefect's "Unable to find block document named …"
            raise ConfigError(f"status: the saved GcsBucket block {block!r} could not be "
                              f"loaded ({e}) — {fix}") from None
    else:
        bucket = gcs_bucket_from_env_or_block(block)
    folder = GcsFolder(bucket, "records")
    keys = sorted(k for k in folder.list("runs") if SUMMARY_NAME.fullmatch(k.removeprefix("runs/")))
    for key in ([keys[-1]] if keys else []) + ["runs/last-run.json"]:
        got = folder.read(key)
        if got is not None:
            where = folder.url(key)
            try:
                data = json.loads(got[0])
            except json.JSONDecodeError as e:
                raise RecordError(f"{where}: not JSON ({e})") from None
            return where, RunSummary.parse(data, where)
    return None


@dataclass
class RecordsPlace:
    """Where a profile's run records are: what `status` needs of the profile, read without
    building its blocks (a shell that cannot load the graph's or the node's saved blocks can
    still read the records)."""

    name: str
    state_dir: Path
    gcs_block: str | None  # a saved GcsBucket block's name or gs://bucket[/folder]


def records_place(ref: str, bucket: str | None = None) -> RecordsPlace:
    """The profile's state_dir and records bucket as load_profile resolves them (gcs_block,
    else SLM_YOYO_WEIGHTS_GCS_BUCKET); `bucket` (gs://bucket[/folder]) overrides both."""
    path = profile_path(ref)
    if not path.is_file():
        load_profile(ref)  # its error names the profiles there are
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"profile {path}: not valid TOML ({e}) — fix the syntax") from e
    block = data.get("gcs_block") or None
    if block is not None and not isinstance(block, str):
        raise ConfigError(f"profile {path}: gcs_block must be the name of a saved GcsBucket "
                          f"block (a string), got {block!r}")
    if bucket:
        b, folder = parse_bucket_url(bucket, where="--bucket")
        block = f"gs://{b}/{folder}" if folder else f"gs://{b}"
    return RecordsPlace(path.stem, Path(project_path(str(data.get("state_dir", ".slm-nightly")))),
                        block or env_bucket())


def read_status(place: RecordsPlace, now: datetime | None = None,
                max_age_hours: float = MAX_AGE_HOURS) -> Status | str:
    """The newest night judged, or a sentence saying where no summary was found."""
    block = place.gcs_block
    found = newest_in_bucket(block) if block else newest_local(place.state_dir)
    if found is None:
        where = (f"{block} (records/runs/)" if block
                 else str(place.state_dir / "runs" / "last-run.json"))
        return f"no run summary in {where}: no night has run on profile {place.name}"
    return judge(*found, now or datetime.now(UTC), max_age_hours)


def render(st: Status, profile_ref: str) -> str:
    when = ("finished at an unknown time" if st.finished is None else
            f"finished {st.finished.isoformat()} ({st.age_hours:.1f} h ago)")
    verdict = (f"status: OK — the newest night ended {st.summary.status} "
               f"{st.age_hours:.1f} h ago" if st.ok else
               "status: NOT OK — " + "; ".join(st.problems))
    return "\n".join([f"run summary: {st.source}", when, "", render_text(st.summary, profile_ref),
                      "", verdict])
