"""`slm-nightly run`, `status` and `alerts`: run the night, read how the newest one ended, and
install the alerts that watch it."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from flows.cli.parsing import add_json, add_profile, command, command_group
from tasks.records import RunSummary
from tasks.runtime import logs, prefect_env


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
    from tasks.night.summary import render_text
    from tasks.runtime.interrupts import RunStopper, say

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
    from tasks.night.alerts import ALERTS_FILE, install

    rows = install(args.notify_block, args.deployment, Path(args.file or ALERTS_FILE))
    for r in rows:
        print(f"{r['action']} automation '{r['name']}' ({r['id']})")
    return 0


def add_run(sub: Any) -> None:
    run = command(sub, "run", _run, help="run the nightly pipeline")
    add_profile(run)
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


def add_status(sub: Any) -> None:
    st = command(sub, "status", _status,
                 help="the newest night's run summary (from the profile's bucket, records/, else the "
                 "local state_dir), its age; exit 1 when it did not end completed or partial, or finished "
                 "over 26 h ago")
    add_profile(st)
    st.add_argument("--bucket", help="read gs://BUCKET[/FOLDER]/records/ instead of the "
                    "profile's bucket (application-default credentials; no Prefect API needed)")
    st.add_argument("--max-age-hours", type=float, default=26.0,
                    help="a newest night older than this is reported (default 26)")
    add_json(st)


def add_alerts(sub: Any) -> None:
    alsub = command_group(sub, "alerts", "the nightly's Prefect automations", _alerts)
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
