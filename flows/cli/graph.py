"""`slm-nightly graph …`: look at the property graph, snapshot, restore and compact it."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

from flows.cli.parsing import add_json, add_profile, command_group, print_rows
from tasks.shared.errors import ConfigError


def _local_neo4j(args: argparse.Namespace) -> int:
    """Neo4j Community on this machine until Ctrl-C: its URI and a profile's [graph] table."""
    from tasks.graph import neo4j_local

    password = os.environ.get(neo4j_local.PASSWORD_ENV) or secrets.token_urlsafe(16)
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="local-neo4j-"))
    print(f"starting Neo4j Community {neo4j_local.VERSION} (the first start on a machine "
          "resolves it with Maven: about a minute)", file=sys.stderr, flush=True)
    with neo4j_local.running(password, work, heap=args.heap) as server:
        print(f"Neo4j Community {neo4j_local.VERSION} at {server.uri}, user {server.user} "
              f"(a scratch server: its data goes when it stops; its log: {server.log})\n"
              f"A profile's graph on it:\n\n{server.profile_snippet()}\nCtrl-C stops it.",
              flush=True)
        try:
            code = server.process.wait()
        except KeyboardInterrupt:
            return 0
    print(f"Neo4j exited {code} — see {server.log}", file=sys.stderr)
    return 1


def _graph(args: argparse.Namespace) -> int:
    from tasks.graph import snapshots as snap
    from tasks.graph.open import embedded_port, open_graph, snapshot_writer
    from tasks.profile import load_profile

    if args.graph_command == "local-neo4j":
        return _local_neo4j(args)
    cfg = load_profile(args.profile)
    if args.graph_command in ("snapshots", "restore"):
        return _graph_snapshots(args, cfg)

    ledger = snap.GraphCounts(cfg.state_dir, cfg.graph.describe())
    with open_graph(cfg.graph, progress=sys.stderr) as store:
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
            stats = store.stats()
            write = snapshot_writer(cfg.graph, store, stats)
            if write is None:
                raise ConfigError("graph snapshot: the embedded FalkorDB and Neo4j are "
                                  "snapshotted here, with [graph] snapshots_keep > 0; back up "
                                  "an external FalkorDB with its own tools")
            out = snap.take(cfg.snapshot_config(), write, stats, "cli")
            print(json.dumps(out.model_dump(), indent=2) if args.json else
                  f"snapshot {out.name}: {out.path} ({out.bytes / 1e6:.1f} MB)"
                  + (f", copied to {out.gcs}" if out.gcs else "")
                  + (f", NOT copied to GCS: {out.gcs_error}" if out.gcs_error else ""))
        elif args.graph_command == "compact":
            port = embedded_port(cfg.graph)
            if port is None:
                raise ConfigError("graph compact: only the embedded FalkorDB graph")
            from tasks.graph import falkordb_server

            print(json.dumps(falkordb_server.compact(port, force=True)))
        elif args.graph_command == "evidence":
            return _evidence(store, args)
        elif args.graph_command == "merges":
            _merges(store, args)
        elif args.graph_command == "split":
            docs = store.split(args.key, args.forms)
            ledger.record(store.stats(), note=f"graph split {args.key}: {', '.join(args.forms)}")
            print(f"split {', '.join(repr(f) for f in args.forms)} from {args.key}: "
                  f"{len(docs)} document(s) retracted, extracted again by the next run without "
                  "the join (later runs keep them apart too)")
            for d in docs:
                print(f"  {d}")
        else:
            print_rows(store.query(args.cypher), args.json)
    return 0


def _merges(store: Any, args: argparse.Namespace) -> None:
    """The joins, newest first, with their evidence; then the forms kept apart by a split."""
    rows = store.merges(args.key, args.limit)
    splits = [{"key": k, "form": f} for k, forms in sorted(store.splits().items())
              for f in sorted(forms) if args.key in (None, k)]
    if args.json:
        print(json.dumps({"joins": rows, "splits": splits}, indent=2, ensure_ascii=False))
        return
    if not rows:
        print("no joins: no document's name was put under an entity by an address, its "
              "context or a surname")
    for r in rows:
        print(f"{r['at']}  {r['key']} ({r['name']}) ← {r['form']!r}: {r['evidence']} "
              f"[{r['document']}]")
    for sp in splits:
        print(f"split: {sp['form']!r} is kept apart from {sp['key']}")


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
    from tasks.graph.open import restore_graph

    root = cfg.snapshot_root()
    if args.graph_command == "snapshots":
        rows = [s.model_dump(include={"name", "created_at", "bytes", "nodes", "relationships",
                                      "path"}) for s in snap.list_local(root)]
        print_rows(rows, args.json)
        if not rows and not args.json:
            print(f"no graph snapshots in {root / snap.SNAPSHOTS}")
        return 0
    chosen = snap.find(root, args.name, cfg.snapshot_gcs_block())
    done = restore_graph(cfg.graph, chosen, root, args.replace)
    snap.GraphCounts(cfg.state_dir, cfg.graph.describe()).record(
        done.counts, note=f"restored from snapshot {chosen.name}")
    print(f"restored snapshot {chosen.name} ({chosen.created_at}) into {done.where}"
          + (f"; the data it replaced is kept in {done.kept}" if done.kept else ""))
    return 0


def add_graph(sub: Any) -> None:
    gsub = command_group(sub, "graph", "inspect the property graph", _graph)
    stats = gsub.add_parser("stats", help="node and relationship counts by type")
    query = gsub.add_parser("query", help="run a read-only Cypher query")
    query.add_argument("cypher", help="the query, e.g. \"MATCH (p:Person) RETURN p.name LIMIT 5\"")
    g_ev = gsub.add_parser("evidence", help="the text behind an entity or a relationship: the "
                           "chunks of the documents that name it")
    g_ev.add_argument("entity", help="its key ('Person:anita anand') or its name as stored")
    g_ev.add_argument("--rel", help="a relationship type from the entity (with --to)")
    g_ev.add_argument("--to", help="the relationship's target key")
    g_merges = gsub.add_parser("merges", help="the joins, newest first: each document's name "
                               "put under an entity by evidence beside the name (an e-mail "
                               "address, the document's context, a surname), with that "
                               "evidence; then the forms kept apart by `graph split`")
    g_merges.add_argument("--key", help="only the joins into this entity (its key)")
    g_merges.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    g_split = gsub.add_parser("split", help="undo joins: no evidence joins these forms to the "
                              "entity any more; the documents that joined them are retracted "
                              "and extracted again by the next run")
    g_split.add_argument("key", help="the entity's key, as `graph merges` shows it")
    g_split.add_argument("forms", nargs="+", metavar="FORM",
                         help="a joined form of the name, as `graph merges` shows it (any case)")
    g_snap = gsub.add_parser("snapshot", help="snapshot the graph now (the embedded FalkorDB's "
                             "RDB image, or Neo4j's logical export)")
    g_list = gsub.add_parser("snapshots", help="list the graph snapshots kept")
    g_rest = gsub.add_parser("restore", help="put a snapshot back (the newest by default): the "
                             "embedded graph's data folder is replaced (and kept); Neo4j's "
                             "database must be empty")
    g_rest.add_argument("name", nargs="?", help="snapshot name (slm-nightly graph snapshots)")
    g_rest.add_argument("--replace", action="store_true", help="Neo4j: a database that is not "
                        "empty is exported beside the snapshots (replaced-<time>.jsonl.gz), "
                        "emptied, then restored")
    g_acc = gsub.add_parser("accept", help="record the graph as it is now as what it should "
                            "hold (after a deliberate change)")
    g_comp = gsub.add_parser("compact", help="rewrite the embedded graph's append-only file")
    g_neo = gsub.add_parser("local-neo4j", help="run Neo4j Community 5.26 on this machine "
                            "(Java 17 and Maven), print its bolt:// URI and a profile's [graph] "
                            "table, until Ctrl-C: the production store to try; its data goes "
                            "when it stops")
    g_neo.add_argument("--heap", default="1g", help="the JVM's maximum heap (default 1g)")
    g_neo.add_argument("--workdir", help="where its data and log go (default: a new temporary "
                       "folder)")
    for p in (stats, query, g_ev, g_merges, g_split, g_snap, g_list, g_rest, g_acc, g_comp):
        add_profile(p)
        add_json(p)
