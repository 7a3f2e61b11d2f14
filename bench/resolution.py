"""Phase 1's write of contacts with entity resolution against without, in one run, on the
embedded FalkorDB at 100k people.

Each side writes the same contact files (1,000 records each; 1 % of the people share a name with
another person and have their own address, every tenth organization is written with a legal
form) into an empty graph, a file per batch, the way tasks/extraction/batch.py does: the graph
lookup, build_batch, upsert. "without" is the lookup before issue 52 (the Persons holding the
batch's addresses); "with" is known_people (also every address of the Persons of the batch's
names). Then the same files again: the unchanged night. Prints both sides, the ratios, and the
Persons and Organizations each side made.

    python bench/resolution.py [N]      # N people (default 100000)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import report

from tasks.extraction.answers import BatchReport, build_batch
from tasks.extraction.batch import known_people
from tasks.extraction.calls import DocOutcome
from tasks.extraction.documents import Document
from tasks.graph import falkordb_server
from tasks.graph.falkordb_store import FalkorDBStore
from tasks.graph.store import GraphStore

PER_FILE = 1_000


def files(n: int) -> list[Document]:
    """Contact files of PER_FILE records: person i is "Given{i} Family{i % 991}", unless i is
    a namesake (i % 100 == 99, after the first file), who takes the name of person i-PER_FILE-1
    (in the file before: the graph holds that one) with an address of its own."""
    docs = []
    for start in range(0, n, PER_FILE):
        records = []
        for i in range(start, min(n, start + PER_FILE)):
            who = i - PER_FILE - 1 if i % 100 == 99 and i > PER_FILE else i
            org = f"Org {i % 5000}" + (" Inc." if i % 10 == 0 else "")
            records.append({"name": f"Given{who} Family{who % 991}", "title": "",
                            "emails": [f"p{i}@x.example"], "phones": [], "organization": org})
        docs.append(Document(f"contacts/{start}.json", "contacts", f"/c/{start}.json",
                             f"h{start}", "", {}, records))
    return docs


def write(store: GraphStore, docs: list[Document], resolve: bool) -> float:
    t = time.perf_counter()
    for d in docs:
        known = known_people(store, [d]) if resolve else store.keys_by_email(
            [e for r in d.records for e in r["emails"]])
        store.upsert(build_batch([DocOutcome(d, [])], "m", known, BatchReport()))
    return time.perf_counter() - t


def side(port: int, docs: list[Document], resolve: bool) -> dict[str, Any]:
    store = FalkorDBStore("127.0.0.1", port, f"resolution_{resolve}", batch_size=1000)
    store.ensure_schema()
    first = write(store, docs, resolve)
    again = write(store, docs, resolve)
    nodes = store.stats()["nodes"]
    store.close()
    return {"first_night_s": first, "unchanged_night_s": again,
            "people_per_s": sum(len(d.records) for d in docs) / first,
            "persons": nodes.get("Person", 0), "organizations": nodes.get("Organization", 0)}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    docs = files(n)
    data = Path(tempfile.mkdtemp())
    rec, _ = falkordb_server.start(data)
    try:
        without = side(rec.port, docs, resolve=False)
        with_ = side(rec.port, docs, resolve=True)
    finally:
        falkordb_server.stop(data)
    keys = ("first_night_s", "unchanged_night_s")
    report({"bench": "resolution", "people": n, "namesakes": (n - PER_FILE) // 100,
            "without": {k: round(v, 3) for k, v in without.items()},
            "with": {k: round(v, 3) for k, v in with_.items()},
            "with_over_without": {k: round(with_[k] / without[k], 2) for k in keys}})


if __name__ == "__main__":
    main()
