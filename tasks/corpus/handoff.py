"""The corpus's hand-off to training (phase 2a): score the corpus, publish the card, and hand
each passing bucket over (a cleaned Parquet dataset, then an atomically written
training-pending marker); and the corpus's GCS sync."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from tasks.corpus.buckets import Kind
from tasks.corpus.scorecard import RULES, ScorecardConfig, score_bucket, scorecard_of
from tasks.records import (
    BucketScore,
    BucketVerdict,
    Scorecard,
    ScorecardSummary,
    SyncReport,
    TrainingMarker,
)
from tasks.shared.files import replacing
from tasks.shared.gcs_sync import ENV_BUCKET, gcs_bucket_from_env_or_block, sync_folder


def score_corpus(corpus: Path, buckets: dict[str, Kind], cfg: ScorecardConfig
                 ) -> tuple[list[BucketScore], dict[str, pl.DataFrame]]:
    cards, clean = [], {}
    for bucket, kind in buckets.items():
        card, rows = score_bucket(corpus, bucket, kind, cfg)
        cards.append(card)
        clean[bucket] = rows
    return cards, clean


def render_card(card: Scorecard) -> str:
    lines = [f"Corpus scorecard v{card.version} — {card.corpus} — floor {card.floor} "
             "clean pairs"]
    for b in card.buckets:
        verdict = "PASS" if b.passed else "FAIL"
        lines += ["", f"{b.bucket} ({b.kind}): {verdict} — {b.clean} clean of "
                  f"{b.total} rows ({b.raw_lines} raw lines, information only)"]
        lines += [f"  why: {r}" for r in b.reasons]
        lines += [f"  {rule:<24}{b.rules[rule]:>8}" for rule in RULES]
        if b.pii_flagged:
            lines.append(f"  {'pii flagged (kept)':<24}{b.pii_flagged:>8}")
        lines.append("  sources:" + "".join(
            f"\n    {s.source:<30}{s.clean:>7} clean / {s.total:>7}  "
            f"({s.share_of_clean:.0%} of clean)" for s in b.sources))
    return "\n".join(lines)


def markdown_card(card: Scorecard) -> str:
    out = [f"# Corpus scorecard (floor {card.floor})", ""]
    for b in card.buckets:
        out += [f"## {b.bucket}: {'PASS' if b.passed else 'FAIL'}", "",
                f"{b.clean} clean of {b.total} rows ({b.raw_lines} raw lines)."]
        out += [f"- {r}" for r in b.reasons]
        out += ["", "| rule | failures |", "|---|---:|"]
        out += [f"| {r} | {b.rules[r]} |" for r in RULES]
        out += ["", "| source | total | clean | share of clean |", "|---|---:|---:|---:|"]
        out += [f"| {s.source} | {s.total} | {s.clean} | {s.share_of_clean:.1%} |"
                for s in b.sources]
        out.append("")
    return "\n".join(out)


@task(name="score-corpus", cache_policy=NO_CACHE)
def score_and_publish(corpus: Path, buckets: dict[str, Kind], cfg: ScorecardConfig,
                      state_dir: Path) -> tuple[Scorecard, Path, dict[str, pl.DataFrame]]:
    """Score every bucket; write the versioned scorecard JSON and publish it as artifacts."""
    cards, clean = score_corpus(corpus, buckets, cfg)
    card = scorecard_of(cards, cfg, corpus)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = card.save(state_dir / "scorecards" / f"scorecard-{stamp}.json")
    card.save(state_dir / "scorecards" / "latest.json")
    rows = [{"bucket": b.bucket, "passed": b.passed, "clean": b.clean, "total": b.total,
             "floor": cfg.floor, **b.rules} for b in cards]
    create_table_artifact(rows, key="corpus-scorecard", description="Scorecard per bucket")
    create_markdown_artifact(markdown_card(card), key="corpus-scorecard-report",
                             description="Why each bucket passed or failed")
    logger = get_run_logger()
    for b in cards:
        logger.info("%s: %s, %d clean of %d (floor %d)%s", b.bucket,
                    "PASS" if b.passed else "FAIL", b.clean, b.total, cfg.floor,
                    "" if b.passed else " — " + "; ".join(b.reasons))
    return card, path, clean


@task(name="hand-over-to-training", cache_policy=NO_CACHE)
def hand_over(card: Scorecard, scorecard_path: Path, clean: dict[str, pl.DataFrame],
              state_dir: Path) -> list[TrainingMarker]:
    """For each passing bucket: the cleaned dataset as Parquet (train/eval split column), then
    the training-pending marker — written last and atomically, so it never points at a
    dataset that is not complete."""
    markers = []
    for b in card.buckets:
        if not b.passed:
            continue
        dataset = state_dir / "datasets" / b.bucket / f"{b.digest[:16]}.parquet"
        with replacing(dataset) as tmp:
            clean[b.bucket].write_parquet(tmp)
        marker = TrainingMarker(bucket=b.bucket, kind=b.kind, clean=b.clean,
                                corpus_digest=b.digest, scorecard=str(scorecard_path.resolve()),
                                dataset=str(dataset.resolve()),
                                time=datetime.now(UTC).isoformat(timespec="seconds"))
        marker.save(state_dir / "training-pending" / f"{b.bucket}.json")
        markers.append(marker)
    return markers


@task(name="sync-corpus-to-gcs", cache_policy=NO_CACHE)
def sync_corpus(corpus: Path, gcs_block: str | None) -> SyncReport | None:
    """Upload new and changed corpus files to GCS, if a bucket is configured; a failure is
    reported in the summary and the local corpus stays as it is."""
    logger = get_run_logger()
    bucket = gcs_bucket_from_env_or_block(gcs_block)
    if bucket is None:
        logger.info("no GCS sync: set %s or [corpus] gcs_block to enable it", ENV_BUCKET)
        return None
    report = sync_folder(corpus, bucket)
    if report.error:
        logger.warning("GCS sync failed (local corpus kept): %s", report.error)
    else:
        logger.info("GCS sync to gs://%s/%s: %d uploaded, %d unchanged", report.bucket,
                    report.prefix, report.uploaded, report.unchanged)
    return report


def summary_of(card: Scorecard, path: Path, markers: list[TrainingMarker],
               synced: SyncReport | None) -> ScorecardSummary:
    """What the run summary keeps of the scorecard."""
    return ScorecardSummary(
        floor=card.floor, scorecard=str(path.resolve()),
        buckets={b.bucket: BucketVerdict(passed=b.passed, clean=b.clean, total=b.total,
                                         reasons=b.reasons) for b in card.buckets},
        training_pending=[m.bucket for m in markers], gcs_sync=synced)

