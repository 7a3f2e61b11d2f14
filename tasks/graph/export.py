"""A Neo4j graph as a file, and back: the logical snapshot Community can take while the server
runs (`neo4j-admin database dump` needs the database stopped there).

The export reads every node and relationship in ONE read transaction, so it sees the graph as of
one moment of the night's writes (the night is the graph's only writer, and it exports after its
last write), and writes gzip'd JSON lines:

    {"format": "slm-graph", "version": 1, "nodes": {...}, "relationships": {...}}   the counts
    {"labels": ["Entity", "Person"], "props": {...}}                                 a node
    {"type": "WORKS_FOR", "src": [kind, key], "dst": [kind, key], "props": {...}}   a relationship

Every node the pipeline writes is found by its key (q.UNIQUE_KEYS: Entity.key, Document.id,
Chunk.id), so a relationship names its ends by (kind, key) and a replay needs no internal ids.
JSON keeps every property type the pipeline stores apart (text, integers, floats, booleans, and
lists of one of them); a property of another type (a date, a point) is refused at export with
its name, not turned into text. The replay writes into an empty database, in transactions
bounded like the upserts, then checks the counts against the file's header.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasks.graph import queries as q
from tasks.graph.ontology import RESERVED_TYPES
from tasks.graph.store import GraphStore, sized_batches
from tasks.shared.errors import GraphError
from tasks.shared.files import replacing

FORMAT, VERSION = "slm-graph", 1
KEY_OF = {label: prop for _, label, prop in q.UNIQUE_KEYS}  # Entity → key, …
_EXPORT_NODES = "MATCH (n) RETURN labels(n) AS labels, properties(n) AS props"
_EXPORT_RELS = ("MATCH (a)-[r]->(b) RETURN type(r) AS type, labels(a) AS al, labels(b) AS bl, "
                "coalesce(a.key, a.id) AS a, coalesce(b.key, b.id) AS b, properties(r) AS props")
Stats = dict[str, dict[str, int]]


def _kind(labels: list[str]) -> str:
    for kind in KEY_OF:
        if kind in labels:
            return kind
    raise GraphError(f"graph export: a node labelled {labels} is none of "
                     f"{sorted(KEY_OF)} — the pipeline writes no such node; remove it or "
                     "export the database with Neo4j's own tools")


def _plain(value: Any, where: str) -> Any:
    """The value as JSON keeps it, or GraphError naming a type JSON would change."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list):
        return [_plain(v, where) for v in value]
    raise GraphError(f"graph export: {where} is a {type(value).__name__}, which this export "
                     "would not give back as it is — export with Neo4j's own tools")


def _props(props: dict[str, Any], where: str) -> dict[str, Any]:
    return {k: _plain(v, f"{where}.{k}") for k, v in props.items()}


def _count(stats: Stats, labels: list[str] | None = None, rel: str | None = None) -> None:
    for label in labels or ():
        stats["nodes"][label] = stats["nodes"].get(label, 0) + 1
    if rel:
        stats["relationships"][rel] = stats["relationships"].get(rel, 0) + 1


def export(store: GraphStore, path: Path) -> Stats:
    """Write the graph to `path` (gzip JSON lines); the counts it holds, as stats() gives
    them. The body is written first (the counts are known only at its end), then the header
    and the body go into a temporary file renamed over `path` (tasks.shared.files.replacing)."""
    stats: Stats = {"nodes": {}, "relationships": {}}
    tmp = path.with_name(path.name + ".body")
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=3) as body:
        for i, row in store.read_together([_EXPORT_NODES, _EXPORT_RELS]):
            if i == 0:
                labels = sorted(row["labels"])
                key = row["props"].get(KEY_OF[_kind(labels)])
                line: dict[str, Any] = {"labels": labels,
                                        "props": _props(row["props"], f"node {key!r}")}
                _count(stats, labels=labels)
            else:
                src, dst = [_kind(row["al"]), row["a"]], [_kind(row["bl"]), row["b"]]
                line = {"type": row["type"], "src": src, "dst": dst,
                        "props": _props(row["props"], f"{row['type']} {src} → {dst}")}
                _count(stats, rel=row["type"])
            body.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
    stats = {k: dict(sorted(v.items())) for k, v in stats.items()}
    head = {"format": FORMAT, "version": VERSION, **stats}
    # the header goes first: a gzip member of its own before the body's (readers join them)
    try:
        with replacing(path) as whole:
            with gzip.open(whole, "wt", encoding="utf-8") as out:
                out.write(json.dumps(head) + "\n")
            with whole.open("ab") as out, tmp.open("rb") as body_file:
                shutil.copyfileobj(body_file, out, 1 << 20)
    finally:
        tmp.unlink(missing_ok=True)
    return stats


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                try:
                    yield json.loads(line)
                except ValueError as e:
                    raise GraphError(f"graph snapshot {path}: line {n} is not JSON ({e}) — "
                                     "the file is damaged; restore another") from e
    except (OSError, EOFError) as e:
        raise GraphError(f"graph snapshot {path}: cannot read it ({e}) — the file is damaged "
                         "or not a snapshot; restore another") from e


def header(path: Path) -> Stats:
    """The counts a snapshot file says it holds (GraphError when it is not one of ours)."""
    head = next(_lines(path), {})
    if head.get("format") != FORMAT or head.get("version") != VERSION:
        raise GraphError(f"graph snapshot {path}: not a {FORMAT} v{VERSION} file (header "
                         f"{str(head)[:120]}) — restore a snapshot this version wrote")
    return {"nodes": head["nodes"], "relationships": head["relationships"]}


def replay(store: GraphStore, path: Path) -> Stats:
    """Write a snapshot into `store`, which must be empty; check what it then holds against the
    file's counts. The counts written."""
    expected = header(path)
    if store.stats()["nodes"]:
        raise GraphError(f"graph restore: {store.location} is not empty — restore into an "
                         "empty database (a new one, or this one emptied: MATCH (n) CALL { "
                         "WITH n DETACH DELETE n } IN TRANSACTIONS)")
    store.ensure_schema()
    nodes: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    rels: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    lines = _lines(path)
    next(lines)
    for line in lines:  # nodes first, then relationships (export's order)
        if "labels" in line:
            nodes[tuple(line["labels"])].append(line["props"])
        else:
            key = (line["type"], line["src"][0], line["dst"][0])
            rels[key].append({"a": line["src"][1], "b": line["dst"][1], "props": line["props"]})
    for labels, rows in sorted(nodes.items()):
        names = ":".join(q.entity_label(label) if label not in KEY_OF else label
                         for label in labels)
        stmt = f"UNWIND $rows AS row CREATE (n:{names}) SET n = row"
        for run in sized_batches(rows, store.batch_size, store.batch_bytes):
            store._write(stmt, {"rows": list(run)})
    for (rel, src, dst), rows in sorted(rels.items()):
        name = rel if rel in RESERVED_TYPES else q.relationship_type(rel)
        stmt = (f"UNWIND $rows AS row MATCH (a:{src} {{{KEY_OF[src]}: row.a}}) "
                f"MATCH (b:{dst} {{{KEY_OF[dst]}: row.b}}) CREATE (a)-[r:{name}]->(b) "
                "SET r = row.props")
        for run in sized_batches(rows, store.batch_size, store.batch_bytes):
            store._write(stmt, {"rows": list(run)})
    got = store.stats()
    if got != expected:
        raise GraphError(f"graph restore: {store.location} holds {got} after the replay, the "
                         f"snapshot says {expected} — the file is damaged or the database was "
                         "written to meanwhile")
    return got
