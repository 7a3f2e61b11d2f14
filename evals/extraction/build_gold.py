"""Build evals/extraction/gold.jsonl: the gold cases of the extraction eval.

    .venv/bin/python evals/extraction/build_gold.py

Reads only files in the repository: the QMSum excerpts copied into evals/extraction/qmsum/
(see copy_qmsum.py and README.md) and the generated research notes in examples/research/.
Deterministic: the same files give the same bytes. Names go through the pipeline's own
resolver (tasks/extraction/resolve.py), so gold and extraction are normalised alike.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from tasks.extraction.documents import Document, load_document  # noqa: E402
from tasks.extraction.resolve import ResolvedName, entity_key, split_name  # noqa: E402

QMSUM = HERE / "qmsum"
RESEARCH = REPO / "examples" / "research"
GOLD = HERE / "gold.jsonl"
SPLITS = {"train": "train", "val": "validation"}  # copied folder -> split name
CHUNK_MIN, CHUNK_MAX = 1200, 1600
CHUNKS_PER_MEETING = 5

_LABEL = re.compile(r"^\*\*(.+?):\*\*")
_ROLE_ONLY = re.compile(r"^(the\s+)?(acting\s+)?(deputy\s+)?(chair|speaker|clerk)$", re.I)
# "Mr. Baker", "Minister Bibeau", and "Mr.Barsalou-Duval": the source often drops the space.
_TITLES = r"(?:(?:Mr|Mrs|Ms|Dr)\.\s*|(?:Mr|Mrs|Ms|Miss|Dr|Minister)\s+)"
_PARTICLES = {"van", "von", "de", "du", "des", "da", "di", "la", "le", "st.", "saint"}

# Party abbreviations of House of Commons speaker labels ("NanaimoLadysmith, GP").
# "Ind." (independent) names no party, so it gives no gold.
PARTIES: dict[str, tuple[str, list[str]]] = {
    "CPC": ("Conservative Party of Canada", ["CPC", "Conservative Party", "Conservatives"]),
    "Lib.": ("Liberal Party of Canada", ["Lib.", "Liberal Party", "Liberals"]),
    "NDP": ("New Democratic Party", ["NDP"]),
    "BQ": ("Bloc Québécois", ["BQ", "Bloc Quebecois", "Bloc"]),
    "GP": ("Green Party of Canada", ["GP", "Green Party"]),
}

# Organisations named in the copied excerpts, found by exact (case-sensitive, whole-word)
# match of any form. Hand-made from reading the excerpts; first form is the name.
ORGANIZATIONS: list[list[str]] = [
    # House of Commons of Canada committee meetings (covid_*)
    ["House of Commons", "House of Commons of Canada"],
    ["Special Committee on the COVID-19 Pandemic"],
    ["Government of Canada"],
    ["World Health Organization", "WHO"],
    ["Canada Revenue Agency", "CRA"],
    ["Public Health Agency of Canada", "PHAC"],
    ["Royal Canadian Mounted Police", "RCMP"],
    ["Canadian Armed Forces", "CAF"],
    ["Transport Canada"],
    ["Canadian Transportation Agency"],
    ["Air Canada"],
    ["National Assembly"],
    ["Canadian Craft Brewers Association"],
    ["BC Fruit Growers' Association"],
    # Senedd Cymru committee meetings (education_*)
    ["Welsh Government"],
    ["Children, Young People and Education Committee"],
    ["Estyn"],
    ["Public Health Wales"],
    ["Sport Wales"],
    ["Natural Resources Wales"],
    ["Education Workforce Council", "EWC"],
    ["University of South Wales", "USW"],
    ["Higher Education Funding Council for Wales", "HEFCW"],
    ["National Association of Head Teachers", "NAHT"],
    ["Association of Directors of Education in Wales", "ADEW"],
]


# The two prose notes of examples/research are fixed text in make_examples.py; their gold
# is written by hand here. Recall only: a model may fairly name more (roles, the corpus).
PROSE_NOTES: dict[str, tuple[list[tuple[str, str, list[str]]], list[tuple[int, str, int]]]] = {
    "icsi-meeting-recorder.md": (
        [("Organization", "International Computer Science Institute", ["ICSI"]),
         ("Location", "Berkeley", []),
         ("Project", "ICSI Meeting Recorder project",
          ["ICSI Meeting Recorder", "Meeting Recorder project", "Meeting Recorder"]),
         ("Organization", "Berkeley Meeting Recorder group",
          ["Berkeley Meeting Recorder", "Meeting Recorder group"]),
         ("Decision", "use close-talking microphones", ["close-talking microphones"])],
        [(0, "LOCATED_IN", 1), (3, "DECIDED", 4)],
    ),
    "remote-control-market.md": (
        [("Organization", "Real Reaction", ["Real Reaction design team"]),
         ("Product", "remote control", ["trendy remote control"])],
        [],
    ),
}


@dataclass
class Case:
    id: str
    split: str
    source: str
    complete: bool
    stream: str
    title: str
    text: str
    entities: list[dict[str, Any]] = field(default_factory=list)
    relationships: list[dict[str, Any]] = field(default_factory=list)
    _index: dict[str, str] = field(default_factory=dict)  # entity_key -> gold id

    def entity(self, etype: str, name: str, kind: str, aliases: Sequence[str] = ()) -> str:
        key = entity_key(etype, name)
        if key not in self._index:
            eid = f"e{len(self.entities) + 1}"
            self._index[key] = eid
            self.entities.append({"id": eid, "type": etype, "name": name, "aliases": [],
                                  "kind": kind})
        ent = self.entities[int(self._index[key][1:]) - 1]
        for a in aliases:
            if a != name and a not in ent["aliases"]:
                ent["aliases"].append(a)
        return self._index[key]

    def relate(self, source: str, rtype: str, target: str, kind: str) -> None:
        rel = {"source": source, "type": rtype, "target": target, "kind": kind}
        if rel not in self.relationships:
            self.relationships.append(rel)

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "split": self.split, "source": self.source,
                "complete": self.complete, "stream": self.stream, "title": self.title,
                "text": self.text, "entities": self.entities,
                "relationships": self.relationships}


# --- QMSum committee meetings ------------------------------------------------------------

def read_meeting(path: Path) -> tuple[dict[str, Any], list[str]]:
    """Front matter and the speaker-turn lines of a copied excerpt."""
    text = path.read_text(encoding="utf-8")
    head, sep, body = text[4:].partition("\n---\n")
    if not text.startswith("---\n") or not sep:
        raise ValueError(f"{path}: expected YAML front matter between '---' lines")
    return yaml.safe_load(head), [ln for ln in body.splitlines() if _LABEL.match(ln)]


def chunk_turns(turns: list[str], lo: int = CHUNK_MIN, hi: int = CHUNK_MAX) -> list[str]:
    """Greedy chunks of whole turns, each at most `hi` characters; a chunk that cannot reach
    `lo` (the tail, or one cut short by a long turn) is dropped."""
    chunks: list[str] = []
    current: list[str] = []
    for turn in turns:
        if current and len("\n".join([*current, turn])) > hi:
            chunks.append("\n".join(current))
            current = []
        current.append(turn)
    if current:
        chunks.append("\n".join(current))
    return [c for c in chunks if lo <= len(c) <= hi]


def person(label: str) -> ResolvedName | None:
    """The named person of a speaker label, or None for a role alone ("The Chair")."""
    r = split_name(label)
    if r.role is None and _ROLE_ONLY.match(r.name):
        return None
    if r.name.startswith("Right Hon. "):
        # The resolver keeps this honorific ("Right Hon. Justin Trudeau"); the gold does not.
        r = ResolvedName(r.name.removeprefix("Right Hon. "), r.affiliation, r.role, r.raw)
    return r


def surname(name: str) -> str:
    """'Paul Manly' -> 'Manly'; 'Tako Van Popta' -> 'Van Popta'."""
    words = name.split()
    for i, w in enumerate(words[1:-1], start=1):
        if w.lower() in _PARTICLES:
            return " ".join(words[i:])
    return words[-1]


def party(affiliation: str | None) -> str | None:
    last = (affiliation or "").rsplit(",", 1)[-1].strip()
    return last if last in PARTIES else None


def unique_surnames(participants: list[str]) -> dict[str, str]:
    """Surname -> full name, for surnames that exactly one speaker of the meeting has."""
    names: dict[str, set[str]] = {}
    for label in participants:
        r = person(label)
        if r is not None:
            names.setdefault(surname(r.name), set()).add(r.name)
    return {s: next(iter(n)) for s, n in names.items()
            if len({entity_key("Person", x) for x in n}) == 1}


def _forms(text: str, form: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(form)}(?![\w-])", text) is not None


def meeting_cases(path: Path, split: str) -> list[Case]:
    meta, turns = read_meeting(path)
    meeting = str(meta["meeting_id"])
    by_surname = unique_surnames(list(meta.get("participants") or []))
    chunks = chunk_turns(turns)[:CHUNKS_PER_MEETING]
    if len(chunks) != CHUNKS_PER_MEETING:
        raise ValueError(f"{path}: {len(chunks)} chunks of {CHUNK_MIN}-{CHUNK_MAX} characters, "
                         f"expected {CHUNKS_PER_MEETING}; copy a longer excerpt")
    cases = []
    for i, text in enumerate(chunks):
        case = Case(f"qmsum/{meeting}#{i}", split, "qmsum", False, "transcripts",
                    f"Meeting {meeting}", text)
        speeches = []
        parties: list[tuple[str, str]] = []
        for line in text.splitlines():
            m = _LABEL.match(line)
            assert m is not None
            speeches.append(line[m.end():])
            r = person(m.group(1))
            if r is None:
                continue
            eid = case.entity("Person", r.name, "speaker", [m.group(1)])
            if (p := party(r.affiliation)) is not None:
                parties.append((eid, p))
        spoken = "\n".join(speeches)
        # In-text title + surname mentions ("Mr. Poilievre is next.") of exactly one speaker.
        for sname, full in sorted(by_surname.items()):
            written = sorted(set(re.findall(rf"\b{_TITLES}{re.escape(sname)}(?![\w-])",
                                            spoken)))
            if written:
                case.entity("Person", full, "surname", [*written, sname])
        for eid, p in parties:
            name, aliases = PARTIES[p]
            case.relate(eid, "MEMBER_OF", case.entity("Organization", name, "party", aliases),
                        "party")
        for forms in ORGANIZATIONS:
            if any(_forms(text, f) for f in forms):
                case.entity("Organization", forms[0], "organization", forms[1:])
        cases.append(case)
    return cases


# --- examples/research ------------------------------------------------------------------

def research_case(path: Path) -> Case:
    doc = load_document("research", RESEARCH, path, 1_000_000)
    if not isinstance(doc, Document):
        raise ValueError(f"{path}: the pipeline cannot load it: {doc.reason}")
    case = Case(f"examples/{path.name}", "examples", "examples", False, "research",
                str(doc.metadata.get("title") or doc.id), doc.text)  # as extract.py titles it
    if path.name in PROSE_NOTES:
        entities, rels = PROSE_NOTES[path.name]
        ids = [case.entity(t, n, "examples", a) for t, n, a in entities]
        for s, rtype, t in rels:
            case.relate(ids[s], rtype, ids[t], "examples")
        return case
    # A briefing written by make_examples.py: every name in it is one of these facts.
    rec = yaml.safe_load(path.read_text(encoding="utf-8"))
    org = split_name(rec["organization"], person=False)
    subject = case.entity("Person", rec["subject"], "examples")
    org_id = case.entity("Organization", org.name, "examples",
                         [rec["organization"], *([org.affiliation] if org.affiliation else [])])
    # make_examples.py writes the same person's contact with WORKS_FOR this organisation.
    case.relate(subject, "WORKS_FOR", org_id, "examples")
    for meeting in rec["sources"]:
        said = f"{rec['subject']} took part in meeting {meeting} of the {rec['organization']}."
        if said not in rec["findings"]:
            raise ValueError(f"{path}: no finding says '{said}'")
        event = case.entity("Event", f"Meeting {meeting}", "examples", [meeting])
        case.relate(subject, "PARTICIPATED_IN", event, "examples")
        case.relate(event, "PART_OF", org_id, "examples")
    case.complete = True
    return case


def cases() -> list[Case]:
    out: list[Case] = []
    for folder, split in SPLITS.items():
        for path in sorted((QMSUM / folder).glob("*.md")):
            out.extend(meeting_cases(path, split))
    for path in sorted(RESEARCH.iterdir()):
        if path.suffix in (".yaml", ".yml", ".md"):
            out.append(research_case(path))
    return sorted(out, key=lambda c: (c.split, c.id))


def build(out_path: Path = GOLD) -> list[dict[str, Any]]:
    """Write the gold cases to out_path, one JSON object a line; return them."""
    records = [c.record() for c in cases()]
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate case ids")
    out_path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                        encoding="utf-8")
    return records


def summary(records: list[dict[str, Any]]) -> str:
    splits = Counter(r["split"] for r in records)
    ents = Counter(e["kind"] for r in records for e in r["entities"])
    rels = Counter(x["kind"] for r in records for x in r["relationships"])
    complete = sum(r["complete"] for r in records)
    lines = [f"{len(records)} cases ({complete} complete)"]
    lines += [f"  split {s}: {n} cases" for s, n in sorted(splits.items())]
    lines += [f"  entities {k}: {n}" for k, n in sorted(ents.items())]
    lines += [f"  relationships {k}: {n}" for k, n in sorted(rels.items())]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(build()))
    print(f"wrote {GOLD.relative_to(REPO)}")
