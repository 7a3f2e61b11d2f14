"""`slm-nightly adapters …`: the adapter registry — list, show, promote, roll back, download."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flows.cli.parsing import add_json, add_profile, command_group, print_rows
from tasks.records import STATES


def _adapters(args: argparse.Namespace) -> int:
    from tasks.profile import load_profile

    cfg = load_profile(args.profile)
    store = cfg.artifact_store()
    if args.adapters_command == "list":
        current = {b: store.pointer(b).current for b in cfg.corpus.buckets()}
        rows = [{"name": m.name, "bucket": m.bucket, "state": m.state,
                 "eval_loss": m.eval_loss, "verified": m.verified,
                 "promoted": m.name in current.values()} for m in store.list(args.bucket)
                if args.state is None or m.state == args.state]
        print_rows(rows, args.json)
        if not rows and not args.json:
            print(f"no adapters{f' in state {args.state}' if args.state else ''} in {store.where}")
    elif args.adapters_command == "show":
        print(store.manifest(args.name).to_json())
    elif args.adapters_command == "promote":
        print(store.promote(args.name, reason=f"by hand: {args.reason}").to_json())
    elif args.adapters_command == "download":
        dest = store.download(args.name, Path(args.to or args.name))
        print(f"{args.name} from {store.where}: {dest}")
    else:
        print(store.rollback(args.bucket).to_json())
    return 0


def add_adapters(sub: Any) -> None:
    asub = command_group(sub, "adapters", "the adapter registry", _adapters)
    cmds = {cmd: asub.add_parser(cmd, help=text) for cmd, text in (
        ("list", "every adapter, oldest first"),
        ("show", "one adapter's manifest"),
        ("promote", "promote by hand (skips the gate)"),
        ("rollback", "back to the previously promoted adapter"),
        ("download", "copy an adapter's files (manifest, peft/, GGUF, tarball) from the store "
                     "(GCS when configured) to a local folder"))}
    cmds["list"].add_argument("--bucket", help="only this bucket's adapters")
    cmds["list"].add_argument("--state", choices=STATES,
                              help="only adapters in this job state (running: still training, "
                                   "or left so by a run that is gone until the next run "
                                   "reconciles it)")
    add_json(cmds["list"])
    for cmd in ("show", "promote", "download"):
        cmds[cmd].add_argument("name", help="adapter name (slm-nightly adapters list)")
    cmds["promote"].add_argument("--reason", default="operator decision",
                                 help="recorded in the pointer")
    cmds["rollback"].add_argument("bucket", help="e.g. engineering-pointsav")
    cmds["download"].add_argument("--to", help="the folder (default: ./NAME)")
    for p in cmds.values():
        add_profile(p)
