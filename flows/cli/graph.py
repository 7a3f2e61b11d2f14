"""`slm-nightly graph …`: look at the property graph, snapshot, restore and compact it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flows.cli.parsing import add_json, add_profile, command_group, print_rows
from tasks.errors import ConfigError


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
        else:
            print_rows(store.query(args.cypher), args.json)
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
        rows = [s.model_dump(include={"name", "created_at", "bytes", "nodes", "relationships",
                                      "path"}) for s in snap.list_local(root)]
        print_rows(rows, args.json)
        if not rows and not args.json:
            print(f"no graph snapshots in {root / snap.SNAPSHOTS}")
        return 0
    if not cfg.graph.embedded:
        raise ConfigError("graph restore: only the embedded FalkorDB graph is restored here; "
                          "restore Neo4j or an external server with its own tools")
    chosen = snap.find(root, args.name, cfg.snapshot_gcs_block())
    kept = snap.restore(Path(cfg.graph.data_dir), chosen)
    snap.Ledger(cfg.state_dir, cfg.graph.describe()).record(
        chosen.counts(), note=f"restored from snapshot {chosen.name}")
    print(f"restored snapshot {chosen.name} ({chosen.created_at}) into "
          f"{Path(cfg.graph.data_dir).resolve()}"
          + (f"; the data it replaced is kept in {kept}" if kept != Path(cfg.graph.data_dir)
             .resolve() else ""))
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
    g_snap = gsub.add_parser("snapshot", help="snapshot the embedded graph now")
    g_list = gsub.add_parser("snapshots", help="list the graph snapshots kept")
    g_rest = gsub.add_parser("restore", help="replace the embedded graph with a snapshot "
                             "(the newest by default; the replaced data folder is kept)")
    g_rest.add_argument("name", nargs="?", help="snapshot name (slm-nightly graph snapshots)")
    g_acc = gsub.add_parser("accept", help="record the graph as it is now as what it should "
                            "hold (after a deliberate change)")
    g_comp = gsub.add_parser("compact", help="rewrite the embedded graph's append-only file")
    for p in (stats, query, g_ev, g_snap, g_list, g_rest, g_acc, g_comp):
        add_profile(p)
        add_json(p)
