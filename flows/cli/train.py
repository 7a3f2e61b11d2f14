"""`slm-nightly scorecard`, `train` and `train preflight`: phase 2 by hand — score the
corpus, train an adapter, check a recipe before any weight loads."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flows.cli.parsing import PROFILE_ENV, add_json, add_profile, command
from tasks.records import TrainingMarker
from tasks.shared.errors import ConfigError


def _scorecard(args: argparse.Namespace) -> int:
    from tasks.corpus.handoff import render_card, score_corpus
    from tasks.corpus.scorecard import scorecard_of
    from tasks.profile import CorpusSettings, load_profile

    # Without --profile: the production rules (CLEAN_PAIR_FLOOR = 3000, default buckets).
    settings = load_profile(args.profile).corpus if args.profile else CorpusSettings()
    if not (args.corpus or settings.root):
        raise ConfigError("scorecard: pass --corpus DIR (or --profile with a [corpus] root)")
    root = Path(args.corpus or settings.root or "")
    sc = settings.rules_only(args.floor)
    cards, _ = score_corpus(root, settings.buckets(), sc)
    card = scorecard_of(cards, sc, root)
    print(card.to_json() if args.json else render_card(card))
    return 0 if all(c.passed for c in cards) else 1


def _train(args: argparse.Namespace) -> int:
    from flows.train import train
    from tasks.profile import load_profile
    from tasks.training.params import build_params

    cfg = load_profile(args.profile)
    dataset = args.dataset
    bucket = args.bucket
    if not dataset:  # the newest training-pending marker for the bucket
        marker = cfg.state_dir / "training-pending" / f"{bucket}.json"
        if not marker.is_file():
            raise ConfigError(f"train: no --dataset and no marker {marker} — run the scorecard "
                              "(slm-nightly run) or pass --dataset PARQUET")
        dataset = TrainingMarker.load(marker).dataset
    method = args.method or ("dpo" if bucket == cfg.corpus.apprenticeship_bucket else "sft")
    overrides: dict[str, Any] = {"dataset": dataset, "bucket": bucket, "method": method,
                                 "base_model": args.base_model or cfg.training.base_model
                                 or cfg.node.base_model,
                                 "max_steps": args.max_steps,
                                 "peft": {"r": args.lora_r} if args.lora_r is not None else None}
    params = build_params(args.recipe or cfg.training.recipe, overrides)
    state = train(params=params, profile=args.profile, promote=not args.no_promote,
                       created_by="cli", return_state=True)
    if not state.is_completed():
        print(f"training ended {state.name}: {state.message}", file=sys.stderr)
        return 1
    m = state.result().to_dict()
    print(json.dumps({k: m.get(k) for k in ("name", "state", "step", "steps", "loss",
                                            "eval_loss", "verified", "promoted", "gate")},
                     indent=2, default=str))
    return 0


def _preflight(args: argparse.Namespace) -> int:
    from tasks.profile import load_profile
    from tasks.training.memory import G2_STANDARD_4
    from tasks.training.params import TrainParams, resolve
    from tasks.training.preflight import node_limits, preflight

    if args.profile:
        cfg = load_profile(args.profile)
        ref, limits = args.recipe or cfg.training.recipe, node_limits(cfg)
        here = args.here or not cfg.node.remote_training
        model_cache: Path | None = Path(cfg.training.model_cache) if cfg.training.model_cache \
            else cfg.state_dir / "models"
    else:  # the production node, seen from the orchestrator
        ref, limits, here, model_cache = args.recipe or "production", G2_STANDARD_4, args.here, None
    recipe = resolve(TrainParams(dataset="", method=args.method, recipe=ref))
    checks = preflight(recipe, limits, model_cache=model_cache, weights_here=here,
                       base_config=Path(args.base_config) if args.base_config else None)
    if args.json:
        print(json.dumps([{"check": c.name, "status": c.status, "detail": c.detail}
                          for c in checks], indent=2))
    else:
        print(f"preflight of {recipe.source} ({recipe.method}) for {limits.source}:")
        for c in checks:
            print(c.line())
    return 1 if any(c.failed for c in checks) else 0


def add_scorecard(sub: Any) -> None:
    card = command(sub, "scorecard", _scorecard, help="score the training corpus (prints; writes nothing)")
    card.add_argument("--corpus", help="corpus root with the two bucket folders")
    card.add_argument("--floor", type=int, help="clean pairs a bucket needs (default 3000)")
    card.add_argument("--profile", help="take buckets and rule settings from this profile "
                      f"(default: none, the production rules; ${PROFILE_ENV} does not apply)")
    card.add_argument("--json", action="store_true", help="print the card as JSON")


def add_train(sub: Any) -> None:
    tr = command(sub, "train", _train, help="train an adapter on a bucket's dataset (ad hoc)")
    add_profile(tr)
    tr.add_argument("--bucket", default="engineering-pointsav")
    tr.add_argument("--dataset", help="Parquet (default: the bucket's training-pending marker)")
    tr.add_argument("--method", choices=["sft", "dpo"], help="default: by bucket")
    tr.add_argument("--recipe", help="recipes/NAME.yaml (default: the profile's)")
    tr.add_argument("--base-model", help="HF folder, .gguf or org/name@revision")
    tr.add_argument("--max-steps", type=int)
    tr.add_argument("--lora-r", type=int)
    tr.add_argument("--no-promote", action="store_true", help="register only")
    trsub = tr.add_subparsers(dest="train_command")
    pre = command(trsub, "preflight", _preflight,
                  help="check a recipe before any weight loads: base model, export architecture, "
                  "verification memory (prints each check; exit 1 when one fails)")
    pre.add_argument("--recipe", help="recipes/NAME.yaml or a path (default: the profile's, "
                     "else production)")
    pre.add_argument("--profile", help="profiles/NAME.toml or a path: the node whose memory the "
                     "verification must fit (default: a g2-standard-4, the weights not here; "
                     f"${PROFILE_ENV} does not apply)")
    pre.add_argument("--method", choices=["sft", "dpo"], default="sft")
    pre.add_argument("--base-config", help="the base model's config.json (default: the "
                     "recipe's base_config, or the cached model's own)")
    pre.add_argument("--here", action="store_true", help="the weights are on this machine: "
                     "check the base model and GGUF are here too (the default with a local "
                     "compute profile; a GCE node's are on the node)")
    add_json(pre)
