"""Phase 2a as a flow: score the training corpus; hand passing buckets to training.

    prefect deployment run 'scorecard/ad-hoc'          (or: slm-nightly scorecard --corpus DIR)
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from tasks.corpus.handoff import hand_over, score_and_publish, summary_of, sync_corpus
from tasks.profile import load_profile
from tasks.records import ScorecardSummary
from tasks.shared.errors import ConfigError


@flow(name="scorecard", log_prints=True)
def scorecard(profile: str = "local", corpus: str | None = None,
              floor: int | None = None) -> ScorecardSummary:
    """Score both buckets against the composition scorecard (floor: CLEAN_PAIR_FLOOR, 3000 by
    default); for each passing bucket write the cleaned Parquet and a training-pending marker."""
    cfg = load_profile(profile)
    root = corpus or cfg.corpus.root
    if not root:
        raise ConfigError("scorecard: no corpus — set [corpus] root in the profile or pass corpus")
    sc = cfg.corpus.rules_only(floor)
    card, path, clean = score_and_publish(Path(root), cfg.corpus.buckets(), sc, cfg.state_dir)
    markers = hand_over(card, path, clean, cfg.state_dir)
    synced = sync_corpus(Path(root), cfg.corpus.gcs_block) if markers else None
    return summary_of(card, path, markers, synced)
