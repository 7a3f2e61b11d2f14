"""`slm-nightly`: run the pipeline and look at the graph from a shell."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from tasks import prefect_env
from tasks.errors import ConfigError, SlmNightlyError

prefect_env.apply()


def _run(args: argparse.Namespace) -> int:
    from blocks.profile import load_profile
    from flows.nightly import nightly
    from tasks.summary import render_text

    cfg = load_profile(args.profile)  # fail fast, before Prefect starts, on a bad profile
    last = cfg.state_dir / "runs" / "last-run.json"
    before = last.stat().st_mtime if last.exists() else None
    print(f"slm-nightly: running the nightly pipeline on profile '{args.profile}' "
          f"(documents: {', '.join(f'{k}={v}' for k, v in cfg.sources.roots().items())})",
          flush=True)
    state = nightly(profile=args.profile, full=args.full, retry_failed=args.retry_failed,
                    phase1_timeout_seconds=args.phase1_timeout, return_state=True)
    if not last.exists() or last.stat().st_mtime == before:
        print(f"run ended {state.name} before writing a summary: {state.message}", file=sys.stderr)
        return 1
    summary = json.loads(last.read_text())
    print("\n" + render_text(summary, args.profile))
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(last, args.summary)
        print(f"\nsummary JSON: {args.summary}")
    return 0 if state.is_completed() else 1


def _print_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    for r in rows:
        print("  ".join(f"{k}={v}" for k, v in r.items()))


def _graph(args: argparse.Namespace) -> int:
    from blocks.profile import load_profile

    cfg = load_profile(args.profile)
    with cfg.graph.open() as store:
        if args.graph_command == "stats":
            stats = store.stats()
            if args.json:
                print(json.dumps(stats, indent=2))
            else:
                print(cfg.graph.describe())
                for kind in ("nodes", "relationships"):
                    print(f"{kind}:")
                    for k, v in stats[kind].items():
                        print(f"  {k:<20}{v:>8}")
        else:
            _print_rows(store.query(args.cypher), args.json)
    return 0


def _scorecard(args: argparse.Namespace) -> int:
    from blocks.profile import CorpusSettings, load_profile
    from tasks.phase2 import render_card, score_corpus
    from tasks.scorecard import card_json

    # Without --profile: the production rules (CLEAN_PAIR_FLOOR = 3000, default buckets).
    settings = load_profile(args.profile).corpus if args.profile else CorpusSettings()
    if not (args.corpus or settings.root):
        raise ConfigError("scorecard: pass --corpus DIR (or --profile with a [corpus] root)")
    root = Path(args.corpus or settings.root or "")
    sc = settings.scorecard_config(args.floor)
    cards, _ = score_corpus(root, settings.buckets(), sc)
    card = card_json(cards, sc, root)
    print(json.dumps(card, indent=2) if args.json else render_card(card))
    return 0 if all(c.passed for c in cards) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slm-nightly", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the nightly pipeline")
    run.add_argument("--profile", default="local", help="profiles/NAME.toml or a path")
    run.add_argument("--summary", help="also write the run summary JSON here")
    run.add_argument("--full", action="store_true", help="re-extract unchanged documents too")
    run.add_argument("--retry-failed", action="store_true",
                     help="retry unchanged documents that failed before")
    run.add_argument("--phase1-timeout", type=int, default=7200, help="seconds (default 7200)")
    run.set_defaults(func=_run)

    graph = sub.add_parser("graph", help="inspect the property graph")
    gsub = graph.add_subparsers(dest="graph_command", required=True)
    stats = gsub.add_parser("stats", help="node and relationship counts by type")
    query = gsub.add_parser("query", help="run a read-only Cypher query")
    query.add_argument("cypher")
    for p in (stats, query):
        p.add_argument("--profile", default="local")
        p.add_argument("--json", action="store_true")
    graph.set_defaults(func=_graph)

    card = sub.add_parser("scorecard", help="score the training corpus (prints; writes nothing)")
    card.add_argument("--corpus", help="corpus root with the two bucket folders")
    card.add_argument("--floor", type=int, help="clean pairs a bucket needs (default 3000)")
    card.add_argument("--profile", help="take buckets and rule settings from this profile")
    card.add_argument("--json", action="store_true")
    card.set_defaults(func=_scorecard)

    args = parser.parse_args(argv)

    try:
        return int(args.func(args))
    except SlmNightlyError as e:
        print(f"slm-nightly: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
