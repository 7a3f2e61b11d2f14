"""Regenerate examples/ from the QMSum data (a developer tool; never run by the pipeline).

    python examples/make_examples.py --qmsum ../shared/data/qmsum --hh ../shared/data/hh-rlhf

Transcripts are excerpts (front matter kept, the first turns up to a size budget) so that
`make run` stays within a few minutes on a CPU model. Research and contacts are generated
with a fixed seed from the people and organisations that speak in those meetings.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
from pathlib import Path

import yaml

MEETINGS = [
    "ES2005a", "IS1004a", "TS3005a",  # AMI product design
    "Bed004", "Bmr003", "Bro003",  # ICSI research
    "covid_0", "covid_1", "covid_3", "covid_10",  # Canadian House of Commons committee
    "education_1", "education_2",  # Welsh Senedd committee
]
EXCERPT_CHARS = 900
TURN_CHARS = 260
SEED = 20261130

ORGS = {
    "covid": "House of Commons of Canada",
    "education": "Senedd Cymru (Welsh Parliament)",
    "ES": "Real Reaction",
    "IS": "Real Reaction",
    "TS": "Real Reaction",
    "B": "International Computer Science Institute",
}


def _org(meeting: str) -> str:
    for prefix, org in ORGS.items():
        if meeting.startswith(prefix):
            return org
    raise KeyError(meeting)


def excerpt(text: str) -> tuple[str, list[str]]:
    head, _, body = text.partition("\n---\n")
    lines = body.splitlines()
    out, size, speakers = [], 0, []
    for line in lines:
        if size > EXCERPT_CHARS and line.startswith("**"):
            break
        m = re.match(r"\*\*(.+?):\*\*", line)
        if m and m.group(1) not in speakers:
            speakers.append(m.group(1))
        if len(line) > TURN_CHARS:  # keep long speeches short: cut at a sentence end
            cut = line.rfind(". ", 0, TURN_CHARS)
            line = line[: cut + 1 if cut > 40 else TURN_CHARS] + " [...]"
        out.append(line)
        size += len(line) + 1
    return head + "\n---\n" + "\n".join(out).rstrip() + "\n", speakers


def find(qmsum: Path, meeting: str) -> Path:
    for split in ("train", "val"):
        p = qmsum / "transcripts" / split / f"{meeting}.md"
        if p.exists():
            return p
    raise FileNotFoundError(meeting)


def corpus(qmsum: Path, hh: Path, out: Path, per_source: int = 100) -> None:
    """A small training corpus: QMSum Q/A as SFT rows (100 per meeting type), HH-RLHF
    preference pairs as DPO rows (3 files of 100: three sources)."""
    eng = out / "corpus" / "engineering-pointsav"
    eng.mkdir(parents=True, exist_ok=True)
    taken: dict[str, list[str]] = {}
    for line in (qmsum / "sft-train.jsonl").read_text(encoding="utf-8").splitlines():
        src = json.loads(line)["source"]
        if len(taken.setdefault(src, [])) < per_source:
            taken[src].append(line)
    (eng / "qmsum-qa.jsonl").write_text("\n".join(sum(taken.values(), [])) + "\n",
                                        encoding="utf-8")
    shutil.copy(qmsum / "LICENSE", eng / "LICENSE")
    app = out / "corpus" / "apprenticeship-pointsav"
    app.mkdir(parents=True, exist_ok=True)
    pairs = (hh / "harmless-base-test.jsonl").read_text(encoding="utf-8").splitlines()
    for i, name in enumerate(("routing-a", "routing-b", "routing-c")):
        chunk = pairs[i * per_source:(i + 1) * per_source]
        (app / f"{name}.jsonl").write_text("\n".join(chunk) + "\n", encoding="utf-8")
    shutil.copy(hh / "LICENSE", app / "LICENSE")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qmsum", type=Path, required=True)
    ap.add_argument("--hh", type=Path, required=True, help="../shared/data/hh-rlhf")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = ap.parse_args()
    rng = random.Random(SEED)
    people: list[tuple[str, str, str]] = []  # (name as spoken, org, meeting)
    tdir = args.out / "transcripts"
    tdir.mkdir(parents=True, exist_ok=True)
    for meeting in MEETINGS:
        text, speakers = excerpt(find(args.qmsum, meeting).read_text(encoding="utf-8"))
        (tdir / f"{meeting}.md").write_text(text, encoding="utf-8")
        for s in speakers:
            if re.search(r"(Hon\.|Mr\.|Ms\.|Mrs\.| AM$)", s):
                people.append((s, _org(meeting), meeting))
    shutil.copy(args.qmsum / "LICENSE", tdir / "LICENSE")

    seen: dict[str, tuple[str, str, str]] = {}
    for name, org, meeting in people:
        base = re.sub(r"\s*\(.*\)$", "", name)
        inner = re.search(r"\((.*)\)$", name)
        if inner and re.match(r"(Hon\.|Mr\.|Ms\.|Mrs\.)", inner.group(1)):
            base = re.sub(r"\s*\(.*\)$", "", inner.group(1))  # "The Chair (Hon. X (Riding))"
        seen.setdefault(base, (name, org, meeting))
    chosen = sorted(seen.items())
    rng.shuffle(chosen)
    chosen = chosen[:8]

    def plain(n: str) -> str:
        n = re.sub(r"^(Hon\.|Mr\.|Ms\.|Mrs\.|The Acting Chair|The Chair)\s*", "", n)
        n = re.sub(r"\s*\(.*\)$", "", n)
        return re.sub(r"\s+AM$", "", n).strip()

    def email(n: str, org: str) -> str:
        domain = "parl.example.ca" if "Canada" in org else "senedd.example.wales"
        return plain(n).lower().replace(" ", ".").replace("'", "") + "@" + domain

    contacts = []
    for base, (_name, org, meeting) in chosen[:6]:
        contacts.append({
            "name": base,
            "emails": [email(base, org)],
            "phones": [f"+1-613-555-{rng.randint(1000, 9999)}"],
            "organization": org,
            "title": "Member" if "Senedd" in org else "Member of Parliament",
            "notes": f"Spoke at meeting {meeting}. Follow up on the committee's next session.",
        })
    cdir = args.out / "contacts"
    cdir.mkdir(parents=True, exist_ok=True)
    (cdir / "committee.json").write_text(json.dumps(contacts, indent=2) + "\n", encoding="utf-8")
    # Same e-mail, different spelling of the name: contacts must unify by e-mail.
    dup = dict(contacts[0], name=plain(contacts[0]["name"]), phones=[], notes="")
    (cdir / "from-crm.json").write_text(json.dumps(dup, indent=2) + "\n", encoding="utf-8")

    rdir = args.out / "research"
    rdir.mkdir(parents=True, exist_ok=True)
    for i, (base, (_name, org, meeting)) in enumerate(chosen[:4]):
        rec = {
            "title": f"Briefing on {plain(base)}",
            "subject": plain(base),
            "organization": org,
            "date": f"2026-11-{10 + i:02d}",
            "sources": [meeting],
            "findings": [
                f"{plain(base)} took part in meeting {meeting} of the {org}.",
                rng.choice([
                    "Raised questions about funding for the programme.",
                    "Asked for a timeline on the next report.",
                    "Supported the motion under discussion.",
                ]),
            ],
        }
        slug = plain(base).lower().replace(" ", "-")
        (rdir / f"{slug}.yaml").write_text(yaml.safe_dump(rec, sort_keys=False), encoding="utf-8")
    notes = [
        ("remote-control-market.md", "# Remote control market scan\n\nThe Real Reaction design team "
         "(Project Manager, Industrial Designer, Marketing) is building a trendy remote control "
         "priced at 25 Euros. Competitors sell basic grey remotes bundled with televisions.\n"),
        ("icsi-meeting-recorder.md", "# ICSI Meeting Recorder project\n\nThe International Computer "
         "Science Institute in Berkeley records its own research meetings to build a speech corpus. "
         "The Berkeley Meeting Recorder group decided to use close-talking microphones.\n"),
    ]
    for fname, body in notes:
        (rdir / fname).write_text(body, encoding="utf-8")
    corpus(args.qmsum, args.hh, args.out)


if __name__ == "__main__":
    main()
