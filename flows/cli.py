"""`slm-nightly`: run the pipeline and look at the graph from a shell."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from tasks.errors import ConfigError, SlmNightlyError
from tasks.records import STATES
from tasks.runtime import logs, prefect_env

# The default of every `--profile` that has one (run, graph, train, adapters, status: local;
# preflight, node smoke, node prepare-weights: gcp) when set: `export SLM_NIGHTLY_PROFILE=gcp`
# on the orchestrator. An explicit --profile wins. scorecard's and train preflight's --profile
# have no default (without one they apply the production rules) and it leaves them so.
PROFILE_ENV = "SLM_NIGHTLY_PROFILE"


class _ShippedDefault(str):
    """A --profile default as written in the parser ("local", "gcp"): its own type, so that a
    parsed value that is still this object was not typed on the command line."""


class _Parser(argparse.ArgumentParser):
    """argparse, then $SLM_NIGHTLY_PROFILE for a --profile left at its default (the parser
    keeps the shipped default, so the help and docs/reference.md do not depend on the shell)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        ns, rest = super().parse_known_args(args, namespace)
        if isinstance(getattr(ns, "profile", None), _ShippedDefault):
            env = os.environ.get(PROFILE_ENV, "").strip()
            ns.profile_from_env = bool(env)
            ns.profile = env or str(ns.profile)
        return ns, rest


def _env_profile_defaults(parser: argparse.ArgumentParser) -> None:
    """Every --profile with a default, in every subcommand: the default becomes a
    _ShippedDefault (which $SLM_NIGHTLY_PROFILE replaces) and the help says so."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _env_profile_defaults(sub)
        elif action.dest == "profile" and isinstance(action.default, str) and \
                not isinstance(action.default, _ShippedDefault):
            action.default = _ShippedDefault(action.default)
            action.help = (f"{action.help or 'profiles/NAME.toml or a path'} (default: "
                           f"${PROFILE_ENV} when set, else {action.default})")


def _run(args: argparse.Namespace) -> int:
    from tasks.profile import load_profile

    cfg = load_profile(args.profile)  # fail fast, before Prefect starts, on a bad profile
    # Library output (llama.cpp, tqdm, warnings, Prefect's engine lines) goes to the run's log
    # file unless --verbose: tasks/runtime/logs.py.
    with logs.route(cfg.state_dir, verbose=args.verbose) as log:
        code = _run_logged(args, cfg, log)
        print(f"run log: {log.path}", file=log.out)
        return code


def _run_logged(args: argparse.Namespace, cfg: Any, log: logs.RunLog) -> int:
    from prefect.exceptions import TerminationSignal

    from tasks.extraction.inputs import source_roots
    from tasks.runtime.interrupts import RunStopper, say
    from tasks.summary import render_text

    last = cfg.state_dir / "runs" / "last-run.json"
    before = last.stat().st_mtime if last.exists() else None
    print(f"slm-nightly: running the nightly pipeline on profile '{args.profile}' "
          f"(documents: {', '.join(f'{k}={v}' for k, v in source_roots(cfg.sources).items())})",
          file=log.out, flush=True)
    stopper = RunStopper(cfg)  # Ctrl-C / SIGTERM / SIGHUP: tasks/runtime/interrupts.py
    stopper.install()
    stopper.stop_orphans()
    state = None
    try:
        with prefect_env.temporary_server(cfg.state_dir) as server:
            stopper.prefect_server = server
            if server is not None and (rec := server.record()):
                print(f"slm-nightly: temporary Prefect server at {os.environ['PREFECT_API_URL']} "
                      f"(pid {rec.pid}; set PREFECT_API_URL to use your own)", file=log.out,
                      flush=True)
            from flows.nightly import nightly

            state = nightly(profile=args.profile, full=args.full, retry_failed=args.retry_failed,
                            phase1_timeout_seconds=args.phase1_timeout,
                            phase2_timeout_seconds=args.phase2_timeout,
                            night_budget_seconds=args.night_budget, phases=args.phases,
                            buckets=args.bucket or None, retrain=args.retrain,
                            return_state=True)
    except (KeyboardInterrupt, TerminationSignal):
        if stopper.signum is None:
            raise
    except BaseExceptionGroup as group:  # the signal landed inside an anyio task group
        if stopper.signum is None or group.subgroup((KeyboardInterrupt, TerminationSignal)) \
                is None:
            raise
    if stopper.signum is not None:
        stopper.stop_servers()  # normally the run's own teardown has stopped them already
    if not last.exists() or last.stat().st_mtime == before:
        ended = f"was stopped by {stopper.signal_name}" if stopper.signum else \
            f"ended {state.name if state else 'early'}"
        print(f"run {ended} before writing a summary{': ' + str(state.message) if state else ''}",
              file=log.err)
    else:
        from tasks.records import RunSummary

        summary = RunSummary.load(last)
        print("\n" + render_text(summary, args.profile), file=log.out)
        if args.summary:
            Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(last, args.summary)
            print(f"\nsummary JSON: {args.summary}", file=log.out)
    if stopper.signum is not None:
        say(f"run stopped by {stopper.signal_name}; stopped: "
            f"{'; '.join(stopper.stopped) or 'nothing (the run had stopped its servers)'}"
            f"{'; the temporary Prefect server stops at exit' if stopper.prefect_server else ''}"
            ". The next run redoes only the documents not recorded.")
        return 128 + stopper.signum
    if not last.exists() or last.stat().st_mtime == before:
        return 1
    return 0 if state is not None and state.is_completed() else 1


def _print_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    for r in rows:
        print("  ".join(f"{k}={v}" for k, v in r.items()))


def _graph(args: argparse.Namespace) -> int:
    from tasks.graph import snapshots as snap
    from tasks.graph.open import embedded_port, open_graph
    from tasks.profile import load_profile

    cfg = load_profile(args.profile)
    if args.graph_command in ("snapshots", "restore"):
        return _graph_snapshots(args, cfg)

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    ledger = snap.Ledger(cfg.state_dir, cfg.graph.describe())
    with open_graph(cfg.graph, progress=progress) as store:
        if args.graph_command == "stats":
            stats = store.stats()
            check, why = ledger.check(stats)
            if args.json:
                print(json.dumps({**stats, "check": check, "check_detail": why}, indent=2))
            else:
                print(cfg.graph.describe())
                for kind in ("nodes", "relationships"):
                    print(f"{kind}:")
                    for k, v in stats[kind].items():
                        print(f"  {k:<20}{v:>8}")
                print(f"check: {check} — {why}")
        elif args.graph_command == "accept":
            stats = store.stats()
            ledger.record(stats, note="accepted by hand (slm-nightly graph accept)")
            print(f"recorded the graph as it is now: nodes {stats['nodes']}, relationships "
                  f"{stats['relationships']}")
        elif args.graph_command == "snapshot":
            port = embedded_port(cfg.graph)
            if port is None or not cfg.graph.snapshots_to_keep():
                raise ConfigError("graph snapshot: only the embedded FalkorDB graph is "
                                  "snapshotted here (with [graph] snapshots_keep > 0); back up "
                                  "Neo4j or an external server with its own tools")
            out = snap.take(port, cfg.snapshot_root(), store.stats(), cfg.graph.describe(),
                            cfg.graph.snapshots_to_keep(), cfg.snapshot_gcs_block(), "cli")
            print(json.dumps(out, indent=2) if args.json else
                  f"snapshot {out['name']}: {out['path']} ({out['bytes'] / 1e6:.1f} MB)"
                  + (f", copied to {out['gcs']}" if out.get("gcs") else "")
                  + (f", NOT copied to GCS: {out['gcs_error']}" if out.get("gcs_error") else ""))
        elif args.graph_command == "compact":
            port = embedded_port(cfg.graph)
            if port is None:
                raise ConfigError("graph compact: only the embedded FalkorDB graph")
            from tasks.graph import falkordb_server

            print(json.dumps(falkordb_server.compact(port, force=True)))
        elif args.graph_command == "evidence":
            return _evidence(store, args)
        else:
            _print_rows(store.query(args.cypher), args.json)
    return 0


def _evidence(store: Any, args: argparse.Namespace) -> int:
    """The text behind an entity (or one of its relationships): the chunks that name it."""
    keys = [args.entity] if ":" in args.entity else [r["key"] for r in store.query(
        "MATCH (e:Entity) WHERE toLower(e.name) = toLower($n) RETURN e.key AS key "
        "ORDER BY key", {"n": args.entity})]
    if not keys or not store.query("MATCH (e:Entity {key: $k}) RETURN e.key AS key",
                                   {"k": keys[0]}):
        print(f"no entity {args.entity!r} in the graph — give its key (Type:name, e.g. "
              "'Person:anita anand') or its name as stored; list some with slm-nightly graph "
              "query \"MATCH (e:Entity) RETURN e.key LIMIT 20\"", file=sys.stderr)
        return 1
    if len(keys) > 1:
        print(f"{args.entity!r} is the name of {len(keys)} entities: {', '.join(keys)} — give "
              "one key", file=sys.stderr)
        return 1
    key = keys[0]
    if args.rel:
        if not args.to:
            raise ConfigError("graph evidence --rel needs --to KEY (the relationship's target)")
        rows = store.relationship_evidence(key, args.rel, args.to)
        what = f"{key} {args.rel} {args.to}"
    else:
        rows = store.evidence(key)
        what = key
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    if not rows:
        print(f"{what}: no chunk behind it (it comes from front matter or contact records, "
              "or the relationship does not exist)")
        return 0
    for r in rows:
        print(f"── {r['document']} chunk {r['chunk']} [{r['start']}:{r['end']}] ({r['path']})")
        print(r["text"])
    return 0


def _graph_snapshots(args: argparse.Namespace, cfg: Any) -> int:
    from tasks.graph import snapshots as snap

    root = cfg.snapshot_root()
    if args.graph_command == "snapshots":
        rows = [{k: s.get(k) for k in ("name", "created_at", "bytes", "nodes", "relationships",
                                       "path")} for s in snap.list_local(root)]
        _print_rows(rows, args.json)
        if not rows and not args.json:
            print(f"no graph snapshots in {root / snap.SNAPSHOTS}")
        return 0
    from blocks.graph import FalkorDBGraph

    if not isinstance(cfg.graph, FalkorDBGraph) or cfg.graph.host:
        raise ConfigError("graph restore: only the embedded FalkorDB graph is restored here; "
                          "restore Neo4j or an external server with its own tools")
    chosen = snap.find(root, args.name, cfg.snapshot_gcs_block())
    kept = snap.restore(Path(cfg.graph.data_dir), chosen)
    snap.Ledger(cfg.state_dir, cfg.graph.describe()).record(
        {"nodes": chosen["nodes"], "relationships": chosen["relationships"]},
        note=f"restored from snapshot {chosen['name']}")
    print(f"restored snapshot {chosen['name']} ({chosen['created_at']}) into "
          f"{Path(cfg.graph.data_dir).resolve()}"
          + (f"; the data it replaced is kept in {kept}" if kept != Path(cfg.graph.data_dir)
             .resolve() else ""))
    return 0


def _scorecard(args: argparse.Namespace) -> int:
    from tasks.corpus.handoff import render_card, score_corpus
    from tasks.corpus.scorecard import card_json
    from tasks.profile import CorpusSettings, load_profile

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


def _train(args: argparse.Namespace) -> int:
    from flows.train import train_flow
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
        from tasks.records import TrainingMarker

        dataset = TrainingMarker.load(marker).dataset
    method = args.method or ("dpo" if bucket == cfg.corpus.apprenticeship_bucket else "sft")
    overrides: dict[str, Any] = {"dataset": dataset, "bucket": bucket, "method": method,
                                 "base_model": args.base_model or cfg.training.base_model
                                 or cfg.node.base_model,
                                 "max_steps": args.max_steps,
                                 "peft": {"r": args.lora_r} if args.lora_r is not None else None}
    params = build_params(args.recipe or cfg.training.recipe, overrides)
    state = train_flow(params=params, profile=args.profile, promote=not args.no_promote,
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


def _node_preflight(args: argparse.Namespace) -> int:
    """Everything a night on a GCE profile needs, checked without booting the node."""
    from tasks.checks import Check
    from tasks.preflight.prefect_api import api_url_unset
    from tasks.preflight.run import PreflightReport, run_preflight
    from tasks.profile import load_profile

    unset = api_url_unset(args.profile)  # before a saved block loads: no temporary server
    if unset is not None:
        report = PreflightReport(args.profile, [unset])
    else:
        try:
            cfg = load_profile(args.profile)
        except ConfigError as e:  # a saved block that does not load is a failed check too
            report = PreflightReport(args.profile, [Check("profile", False, str(e),
                                                          "fix the profile or save the block")])
        else:
            report = run_preflight(cfg)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.text())
    return 0 if report.ok else 1


def _node(args: argparse.Namespace) -> int:
    if args.node_command == "smoke":
        from flows.smoke import node_smoke
        from tasks.preflight.prefect_api import api_url_unset

        unset = api_url_unset()  # the node's worker and its deployment live there
        if unset is not None:
            raise ConfigError(f"node smoke: {unset.detail} — fix: {unset.fix}")

        result = node_smoke(profile=args.profile, train_timeout_seconds=args.train_timeout)
        print("\n".join(f"{p['phase']:12} {p['status']:7} {p.get('seconds', 0):>7} s  "
                        f"{p['detail']}" for p in result["phases"]))
        print(f"verdict: {result['verdict']}")
        return 0 if result["verdict"] == "passed" else 1
    raise ConfigError(f"node: unknown command {args.node_command!r}")


def _adapters(args: argparse.Namespace) -> int:
    from tasks.profile import load_profile

    cfg = load_profile(args.profile)
    store = cfg.artifact_store()
    if args.adapters_command == "list":
        current = {b: store.pointer(b).get("current") for b in cfg.corpus.buckets()}
        rows = [{"name": m.name, "bucket": m.bucket, "state": m.state,
                 "eval_loss": m.eval_loss, "verified": m.verified,
                 "promoted": m.name in current.values()} for m in store.list(args.bucket)
                if args.state is None or m.state == args.state]
        _print_rows(rows, args.json)
        if not rows and not args.json:
            print(f"no adapters{f' in state {args.state}' if args.state else ''} in {store.where}")
    elif args.adapters_command == "show":
        print(store.manifest(args.name).to_json())
    elif args.adapters_command == "promote":
        print(json.dumps(store.promote(args.name, reason=f"by hand: {args.reason}"), indent=2))
    elif args.adapters_command == "download":
        dest = store.download(args.name, Path(args.to or args.name))
        print(f"{args.name} from {store.where}: {dest}")
    else:
        print(json.dumps(store.rollback(args.bucket), indent=2))
    return 0


def _status(args: argparse.Namespace) -> int:
    """The newest night's summary (the bucket's records/, else the local state), its age."""
    from tasks.status import read_status, records_place, render

    st = read_status(records_place(args.profile, args.bucket), max_age_hours=args.max_age_hours)
    if isinstance(st, str):
        print(json.dumps({"ok": False, "problems": [st]}, indent=2) if args.json else st,
              file=sys.stdout if args.json else sys.stderr)
        return 1
    print(json.dumps(st.to_dict(), indent=2) if args.json else render(st, args.profile))
    return 0 if st.ok else 1


def _alerts(args: argparse.Namespace) -> int:
    from tasks.alerts import ALERTS_FILE, install

    rows = install(args.notify_block, args.deployment, Path(args.file or ALERTS_FILE))
    for r in rows:
        print(f"{r['action']} automation '{r['name']}' ({r['id']})")
    return 0


def _eval(args: argparse.Namespace) -> int:
    """Phase 1 on the gold set: figures printed and written as JSON, gated on --baseline."""
    from tasks.eval_command import eval_extraction

    return eval_extraction(args.profile, split=args.split, out=args.out, baseline=args.baseline,
                           tolerance=args.tolerance, base_url=args.base_url, gold=args.gold,
                           verbose=args.verbose)


def build_parser() -> argparse.ArgumentParser:
    """The `slm-nightly` command line; docs/generate.py renders docs/reference.md from it."""
    parser = _Parser(prog="slm-nightly", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the nightly pipeline")
    run.add_argument("--profile", default="local", help="profiles/NAME.toml or a path")
    run.add_argument("--summary", help="also write the run summary JSON here")
    run.add_argument("--full", action="store_true", help="re-extract unchanged documents too")
    run.add_argument("--retry-failed", action="store_true",
                     help="retry unchanged documents that failed before")
    run.add_argument("--phase1-timeout", type=int, default=7200,
                     help="phase 1's own limit, seconds (default 7200): it ends `partial` on "
                     "time, the documents it did not reach go first on the next run")
    run.add_argument("--phase2-timeout", type=int, default=7200,
                     help="phase 2's own limit, seconds (default 7200)")
    run.add_argument("--night-budget", type=int, default=None,
                     help="one deadline for boot, readiness, phase 1 and phase 2, seconds "
                     "(default: the sum of their limits); each gets the smaller of its own "
                     "limit and what is left")
    run.add_argument("--phases", choices=("all", "extract", "train"), default="all",
                     help="the whole night (default), phase 1 only (extract: no scorecard, no "
                     "training), or phase 2 only (train: the engine is stopped at boot)")
    run.add_argument("--bucket", action="append", help="train only this passing bucket "
                     "(repeatable); the others' markers stay for the next night")
    run.add_argument("--retrain", action="store_true", help="train even when an adapter of "
                     "the same data and parameters exists")
    run.add_argument("--verbose", action="store_true",
                     help="show library output on the terminal too (llama.cpp logs, progress "
                     "bars, warnings, Prefect's engine lines); without it they go to the run's "
                     "log file only, <state_dir>/runs/run-<time>.log")
    run.set_defaults(func=_run)

    graph = sub.add_parser("graph", help="inspect the property graph")
    gsub = graph.add_subparsers(dest="graph_command", required=True)
    stats = gsub.add_parser("stats", help="node and relationship counts by type")
    query = gsub.add_parser("query", help="run a read-only Cypher query")
    query.add_argument("cypher", help="the query, e.g. \"MATCH (p:Person) RETURN p.name LIMIT 5\"")
    g_ev = gsub.add_parser("evidence", help="the text behind an entity or a relationship: the "
                           "chunks of the documents that name it")
    g_ev.add_argument("entity", help="its key ('Person:anita anand') or its name as stored")
    g_ev.add_argument("--rel", help="a relationship type from the entity (with --to)")
    g_ev.add_argument("--to", help="the relationship's target key")
    g_snap = gsub.add_parser("snapshot", help="snapshot the embedded graph now")
    g_list = gsub.add_parser("snapshots", help="list the graph snapshots kept")
    g_rest = gsub.add_parser("restore", help="replace the embedded graph with a snapshot "
                             "(the newest by default; the replaced data folder is kept)")
    g_rest.add_argument("name", nargs="?", help="snapshot name (slm-nightly graph snapshots)")
    g_acc = gsub.add_parser("accept", help="record the graph as it is now as what it should "
                            "hold (after a deliberate change)")
    g_comp = gsub.add_parser("compact", help="rewrite the embedded graph's append-only file")
    for p in (stats, query, g_ev, g_snap, g_list, g_rest, g_acc, g_comp):
        p.add_argument("--profile", default="local", help="profiles/NAME.toml or a path")
        p.add_argument("--json", action="store_true", help="print JSON")
    graph.set_defaults(func=_graph)

    card = sub.add_parser("scorecard", help="score the training corpus (prints; writes nothing)")
    card.add_argument("--corpus", help="corpus root with the two bucket folders")
    card.add_argument("--floor", type=int, help="clean pairs a bucket needs (default 3000)")
    card.add_argument("--profile", help="take buckets and rule settings from this profile "
                      f"(default: none, the production rules; ${PROFILE_ENV} does not apply)")
    card.add_argument("--json", action="store_true", help="print the card as JSON")
    card.set_defaults(func=_scorecard)

    tr = sub.add_parser("train", help="train an adapter on a bucket's dataset (ad hoc)")
    tr.add_argument("--profile", default="local", help="profiles/NAME.toml or a path")
    tr.add_argument("--bucket", default="engineering-pointsav")
    tr.add_argument("--dataset", help="Parquet (default: the bucket's training-pending marker)")
    tr.add_argument("--method", choices=["sft", "dpo"], help="default: by bucket")
    tr.add_argument("--recipe", help="recipes/NAME.yaml (default: the profile's)")
    tr.add_argument("--base-model", help="HF folder, .gguf or org/name@revision")
    tr.add_argument("--max-steps", type=int)
    tr.add_argument("--lora-r", type=int)
    tr.add_argument("--no-promote", action="store_true", help="register only")
    tr.set_defaults(func=_train)
    trsub = tr.add_subparsers(dest="train_command")
    pre = trsub.add_parser("preflight", help="check a recipe before any weight loads: base "
                           "model, export architecture, verification memory (prints each check; "
                           "exit 1 when one fails)")
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
    pre.add_argument("--json", action="store_true", help="print JSON")
    pre.set_defaults(func=_preflight)

    pf = sub.add_parser("preflight", help="check a GCE profile before a night: IAM, the "
                        "instances, the bucket, blocks and secrets, work pools and deployments, "
                        "the engine and the node's worker, the training recipe (prints each "
                        "check; exit 1 when one fails; boots nothing)")
    pf.add_argument("--profile", default="gcp", help="profiles/NAME.toml or a path")
    pf.add_argument("--json", action="store_true", help="print JSON")
    pf.set_defaults(func=_node_preflight)

    nd = sub.add_parser("node", help="the GPU node")
    nsub = nd.add_subparsers(dest="node_command", required=True)
    n_smoke = nsub.add_parser("smoke", help="boot the node, wait for its engine, send one "
                              "structured request and one training step, stop the node "
                              "(always); exit 1 unless every phase passed")
    n_smoke.add_argument("--profile", default="gcp", help="profiles/NAME.toml or a path")
    n_smoke.add_argument("--train-timeout", type=int, default=3600,
                         help="seconds for the training step on the node (default 3600)")
    nd.set_defaults(func=_node)
    from tasks.image import cli as weights

    n_weights = nsub.add_parser("prepare-weights", help="build (or with --check only check) the "
                                "node image's model folder: the GGUF, its tokenizer, the training "
                                "base in the HF cache; run when the image is built, never at boot")
    weights.add_arguments(n_weights)
    n_weights.set_defaults(func=weights.cli_main)

    ad = sub.add_parser("adapters", help="the adapter registry")
    asub = ad.add_subparsers(dest="adapters_command", required=True)
    a_list = asub.add_parser("list", help="every adapter, oldest first")
    a_list.add_argument("--bucket", help="only this bucket's adapters")
    a_list.add_argument("--state", choices=STATES,
                        help="only adapters in this job state (running: still training, or "
                             "left so by a run that is gone until the next run reconciles it)")
    a_list.add_argument("--json", action="store_true", help="print JSON")
    a_show = asub.add_parser("show", help="one adapter's manifest")
    a_show.add_argument("name", help="adapter name (slm-nightly adapters list)")
    a_prom = asub.add_parser("promote", help="promote by hand (skips the gate)")
    a_prom.add_argument("name", help="adapter name (slm-nightly adapters list)")
    a_prom.add_argument("--reason", default="operator decision", help="recorded in the pointer")
    a_roll = asub.add_parser("rollback", help="back to the previously promoted adapter")
    a_roll.add_argument("bucket", help="e.g. engineering-pointsav")
    a_down = asub.add_parser("download", help="copy an adapter's files (manifest, peft/, GGUF, "
                             "tarball) from the store (GCS when configured) to a local folder")
    a_down.add_argument("name", help="adapter name (slm-nightly adapters list)")
    a_down.add_argument("--to", help="the folder (default: ./NAME)")
    for p in (a_list, a_show, a_prom, a_roll, a_down):
        p.add_argument("--profile", default="local", help="profiles/NAME.toml or a path")
    ad.set_defaults(func=_adapters)

    st = sub.add_parser("status", help="the newest night's run summary (from the profile's "
                        "bucket, records/, else the local state_dir), its age; exit 1 when it "
                        "did not end completed or partial, or finished over 26 h ago")
    st.add_argument("--profile", default="local", help="profiles/NAME.toml or a path")
    st.add_argument("--bucket", help="read gs://BUCKET[/FOLDER]/records/ instead of the "
                    "profile's bucket (application-default credentials; no Prefect API needed)")
    st.add_argument("--max-age-hours", type=float, default=26.0,
                    help="a newest night older than this is reported (default 26)")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.set_defaults(func=_status)

    al = sub.add_parser("alerts", help="the nightly's Prefect automations")
    alsub = al.add_subparsers(dest="alerts_command", required=True)
    al_inst = alsub.add_parser("install", help="create or update, on the Prefect server "
                               "PREFECT_API_URL names, the automations of "
                               "automations/nightly-alerts.yaml: a notification when a night "
                               "fails, crashes or times out, and when none completed in 26 h "
                               "(automations of the same name are replaced)")
    al_inst.add_argument("--notify-block", required=True,
                         help="the notification block, TYPE/NAME as `prefect block ls` shows it "
                         "(e.g. slack-webhook/ops) or its name alone")
    al_inst.add_argument("--deployment", default="nightly/production",
                         help="the nightly's deployment, FLOW/NAME (default nightly/production)")
    al_inst.add_argument("--file", help="the automations file (default "
                         "automations/nightly-alerts.yaml)")
    al.set_defaults(func=_alerts)
    ev = sub.add_parser("eval", help="measure phase 1 against a gold set")
    evsub = ev.add_subparsers(dest="eval_command", required=True)
    ev_ex = evsub.add_parser("extraction", help="run the extraction on the gold set's chunks "
                             "(phase 1's own prompt, schema, parsing and resolution), print "
                             "entity, relationship and grounded precision figures, write them "
                             "as JSON; exit 1 when --baseline's gate fails")
    ev_ex.add_argument("--profile", default="local", help="profiles/NAME.toml or a path")
    ev_ex.add_argument("--split", choices=("train", "validation", "examples", "all"),
                       default="validation", help="the gold cases to run (default validation; "
                       "tune on train)")
    ev_ex.add_argument("--out", help="the result JSON (default: "
                       "<state_dir>/eval/extraction-<split>-<time>.json)")
    ev_ex.add_argument("--baseline", help="a saved result of the same model and split: exit 1 "
                       "when entity F1 or recall (type-strict), relationship F1 or recall, or "
                       "grounded precision drops by more than --tolerance (e.g. "
                       "evals/extraction/baseline-local.json)")
    ev_ex.add_argument("--tolerance", type=float, default=0.02,
                       help="the drop the gate allows, absolute (default 0.02)")
    ev_ex.add_argument("--base-url", help="ask this OpenAI-compatible endpoint (default: the "
                       "profile's base_url, else the profile's local llama-server, started for "
                       "the run and stopped after it)")
    ev_ex.add_argument("--gold", help="the gold set, one JSON case a line (default "
                       "evals/extraction/gold.jsonl)")
    ev_ex.add_argument("--verbose", action="store_true", help="show library output on the "
                       "terminal too (else it goes to <state_dir>/eval/runs/run-<time>.log)")
    ev.set_defaults(func=_eval)
    _env_profile_defaults(parser)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Every subcommand's own --help opens with the line its parent lists it with."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not sub.description and helps.get(name):
                    sub.description = str(helps[name])[:1].upper() + str(helps[name])[1:] + "."
                _describe(sub)


def main(argv: list[str] | None = None) -> int:
    prefect_env.apply()  # the CLI is a program: it sets its defaults; importing it sets nothing
    args = build_parser().parse_args(argv)

    if getattr(args, "profile_from_env", False):
        from tasks.profile import PROFILE_DIR, profile_path

        if not profile_path(args.profile).is_file():
            known = sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))
            print(f"slm-nightly: {PROFILE_ENV}={args.profile!r} names no profile "
                  f"({profile_path(args.profile).resolve()} not found) — set it to one of "
                  f"{known} or a path to a .toml file, unset it, or pass --profile",
                  file=sys.stderr)
            return 2
    try:
        return int(args.func(args))
    except SlmNightlyError as e:
        print(f"slm-nightly: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
