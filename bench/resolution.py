"""Phase 1's write of contacts and notes with entity resolution against without, in one run,
on the embedded FalkorDB at 100k people.

Each side writes the same contact files (1,000 records each; 1 % of the people share a name with
another person and have their own address, every tenth organization is written with a legal
form), each with a note beside it that names every fifth of its people alone (as the model
would), into an empty graph, a file and its note per batch, the way tasks/extraction/batch.py
does: the graph lookups, build_batch, upsert. "without" is resolution before issue 52 (the
Persons holding the batch's addresses; a name alone joins its name's Person); "with" is
known_people (also every address of the Persons of the batch's names), people_named (the
namesakes of each name written alone) and the graph's splits, with each join recorded. Then
the same files again: the unchanged night. Prints both sides, the ratios, the Persons and
Organizations each side made, the names alone linked to no one and the joins recorded.

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
from tasks.extraction.batch import resolved_batch
from tasks.extraction.calls import ChunkAnswer, DocOutcome
from tasks.extraction.chunking import Chunk
from tasks.extraction.documents import Document
from tasks.extraction.schema import Extraction
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


def note(contacts: Document) -> DocOutcome:
    """A note naming every fifth person of the file alone (the namesakes among them: i % 100
    == 99), one sentence each, as the model's answer would."""
    names = [r["name"] for r in contacts.records[4::5]]
    text = " ".join(f"{n} joined the call." for n in names)
    d = Document(contacts.id.replace("contacts/", "research/"), "research", contacts.path,
                 contacts.hash, text, {})
    answer = Extraction.model_validate({"entities": [
        {"name": n, "type": "Person", "description": ""} for n in names]})
    return DocOutcome(d, [ChunkAnswer(Chunk(0, 0, len(text), text), [answer])])


def write(store: GraphStore, docs: list[Document], resolve: bool) -> tuple[float, int]:
    t, unlinked = time.perf_counter(), 0
    for d in docs:
        report = BatchReport()
        if resolve:
            batch = resolved_batch([DocOutcome(d, []), note(d)], store, "m", report)
        else:
            known = store.keys_by_email([e for r in d.records for e in r["emails"]])
            batch = build_batch([DocOutcome(d, []), note(d)], "m", known, report)
        store.upsert(batch)
        unlinked += len(report.unlinked)
    return time.perf_counter() - t, unlinked


def side(port: int, docs: list[Document], resolve: bool) -> dict[str, Any]:
    store = FalkorDBStore("127.0.0.1", port, f"resolution_{resolve}", batch_size=1000)
    store.ensure_schema()
    first, unlinked = write(store, docs, resolve)
    again, _ = write(store, docs, resolve)
    stats = store.stats()
    nodes = stats["nodes"]
    store.close()
    return {"first_night_s": first, "unchanged_night_s": again,
            "people_per_s": sum(len(d.records) for d in docs) / first,
            "persons": nodes.get("Person", 0), "organizations": nodes.get("Organization", 0),
            "unlinked_first_night": unlinked,
            "joins": stats["relationships"].get("JOINED", 0)}


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
