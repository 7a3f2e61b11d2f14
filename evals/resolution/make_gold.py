"""Build the resolution eval's gold sets: `python evals/resolution/make_gold.py`.

Each set is a folder of documents phase 1 writes without the model, and `truth.json`, the true
identity of every person and organization mention in them (evals/resolution/README.md):

- transcripts: the QMSum meetings of evals/extraction/qmsum (dev: the train meetings, heldout:
  the val ones), copied as they are; each participant label is a mention of the person it
  names, found by `person_of` (written here, apart from the pipeline's resolver: a chair's
  label gives the member in its parentheses, a title, a riding or role in parentheses and a
  trailing AM/MS/MP come off). Labels that name no one ("The Chair") are no mention.
- contacts: generated from SEED (dev 1, heldout 2): people in four contact files, each with a
  phone, some written again in other spellings (case, a title, accents dropped, an initial)
  with the same address, some again with a new address and their phone written another way;
  namesakes (the same name, their own address, phone and employer), each written once more by
  its phone alone in a fifth file, where 15 % of the others are written once more by an initial
  and their employer alone; every organization written in several legal forms; and
  call notes (transcripts) that name a namesake alone, with the address that tells which one
  in their text.

The heldout set is built the same way from other meetings and another seed, and is not to be
looked at while tuning: report it.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import unicodedata
from pathlib import Path

HERE = Path(__file__).resolve().parent
QMSUM = HERE.parent / "extraction" / "qmsum"
SETS = {"dev": (1, "train"), "heldout": (2, "val")}

GIVEN = ["Priya", "José", "Anna", "Tomás", "Chloé", "Marcus", "Ingrid", "Kenji", "Amara", "Lucas",
         "Zoë", "Omar", "Sofía", "Felix", "Hana", "Diego", "Elena", "Ravi", "Noor", "Björn"]
FAMILY = ["Raman", "Álvarez", "Kowalski", "Okafor", "Lindqvist", "Moreau", "Tanaka", "Haddad",
          "Novák", "Brennan", "Castillo", "Fischer", "Mbeki", "Rossi", "Sato", "Whitfield"]
ORGS = [("Northwind Analytics", ["Northwind Analytics", "Northwind Analytics Inc.",
                                 "Northwind Analytics, Inc.", "The Northwind Analytics"]),
        ("Contoso", ["Contoso Ltd", "Contoso Ltd.", "Contoso Limited"]),
        ("Contoso Labs", ["Contoso Labs", "Contoso Labs GmbH"]),
        ("Fabrikam", ["Fabrikam Corp.", "Fabrikam Corporation", "Fabrikam"]),
        ("Tailspin Toys", ["Tailspin Toys LLC", "Tailspin Toys"]),
        ("Litware", ["Litware plc", "Litware PLC", "Litware"]),
        ("Proseware", ["Proseware S.A.", "Proseware SA", "Proseware"]),
        ("Wingtip & Partners", ["Wingtip & Partners", "Wingtip and Partners"])]
TITLES = ["Dr.", "Ms.", "Mr.", "Prof."]
PEOPLE, FILES, NAMESAKES = 48, 4, 6


def _fold(s: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", s) if not unicodedata.combining(c))


def person_of(label: str) -> str | None:
    """The person a QMSum participant label names ("firstname lastname", folded), or None."""
    s = label.strip()
    chair = re.fullmatch(r"The (?:Acting )?(?:Vice-)?Chair\s*\((.*)\)", s)
    if chair:
        s = chair.group(1)
    if s.endswith(")") and "(" in s:  # the riding or role: from its balanced "(" to the end
        depth, cut = 0, None
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                cut = i
                break
        s = s[:cut].strip() if cut else s
    words = [w for w in s.replace(".", " ").split()
             if w.lower() not in ("hon", "rt", "mr", "mrs", "ms", "miss", "dr")]
    while words and words[-1] in ("AM", "MS", "MP"):
        words.pop()
    if len(words) < 2 or words[0] == "The" or not all(w[:1].isupper() for w in words):
        return None  # a role ("The Chair"), not a name
    return _fold(" ".join(words)).casefold()


def _transcripts(folder: Path, out: Path, truth: dict[str, str]) -> None:
    (out / "transcripts").mkdir(parents=True)
    for src in sorted((QMSUM / folder.name).glob("*.md")):
        shutil.copy(src, out / "transcripts" / src.name)
        text = src.read_text()
        labels = re.findall(r'^  - "(.*)"$', text.split("\n---", 1)[0], re.M)
        for label in labels:
            who = person_of(label)
            if who:
                truth[f"transcripts/{src.name}@{label}"] = f"qmsum:{who}"


def _variant(rng: random.Random, given: str, family: str) -> str:
    """Another spelling of one person's name, as another contact list writes it."""
    return rng.choice([f"{rng.choice(TITLES)} {given} {family}", f"{given} {family}".upper(),
                       _fold(f"{given} {family}"), f"{given[0]}. {family}"])


def _contacts(seed: int, out: Path, people: dict[str, str], orgs: dict[str, str]) -> None:
    rng = random.Random(seed)
    (out / "contacts").mkdir(parents=True)
    names = rng.sample([(g, f) for g in GIVEN for f in FAMILY], PEOPLE)
    who = []  # (truth id, given, family, address, organization's truth id)
    for i, (g, f) in enumerate(names):
        org = rng.randrange(len(ORGS))
        who.append((f"p{i}", g, f, f"{_fold(g).lower()}.{_fold(f).lower()}{i}@"
                    f"{_fold(ORGS[org][0]).lower().replace(' ', '').replace('&', '')}.example",
                    org))
    for j in range(NAMESAKES):  # the name of person j, another person, address and employer
        _, g, f, _, org = who[j]
        other = (org + 1 + j % (len(ORGS) - 1)) % len(ORGS)
        who.append((f"n{j}", g, f, f"{_fold(g).lower()[0]}{_fold(f).lower()}@other{j}.example",
                    other))
    files: list[list[tuple[str, dict[str, object]]]] = [[] for _ in range(FILES + 1)]
    phones = random.Random(seed * 1000)  # the phones' own draws: the rest is as it was
    for n, (pid, g, f, address, org) in enumerate(who):
        first = n % FILES if pid.startswith("p") else (int(pid[1:]) + 2) % FILES
        files[first].append((pid, {"name": f"{g} {f}", "emails": [address],
                                   "phones": [f"+1 555 {100 + n:03d} {4000 + n:04d}"],
                                   "organization": rng.choice(ORGS[org][1])}))
        if pid.startswith("p") and rng.random() < 0.4:  # written again elsewhere
            files[(first + 1) % FILES].append((pid, {"name": _variant(rng, g, f),
                                                     "emails": [address.upper()],
                                                     "organization": rng.choice(ORGS[org][1])}))
        national = f"(555) {100 + n:03d}-{4000 + n:04d}"
        if pid.startswith("p") and phones.random() < 0.25:  # a new address, the same phone
            files[FILES].append((pid, {
                "name": f"{g} {f}", "emails": [f"{_fold(g).lower()}{n}@home.example"],
                "phones": [national], "organization": phones.choice(ORGS[org][1])}))
        if pid.startswith("n"):  # a namesake by its phone alone, after its first record
            files[FILES].append((pid, {"name": f"{g} {f}", "phones": [national]}))
        elif phones.random() < 0.15:  # an initial at the same employer, no address or phone
            files[FILES].append((pid, {"name": f"{g[0]}. {f}",
                                       "organization": phones.choice(ORGS[org][1])}))
    for k, rows in enumerate(files):
        doc = f"contacts/team-{k}.json"
        (out / doc).write_text(json.dumps([r for _, r in rows], ensure_ascii=False, indent=1))
        for i, (pid, r) in enumerate(rows):
            people[f"{doc}#{i}"] = pid
            if "organization" in r:
                orgs[f"{doc}#{i}"] = "org:" + next(o for o, forms in ORGS
                                                   if r["organization"] in forms)
    # call notes naming a namesake alone, with the address that tells which one
    for j in range(NAMESAKES):
        pid, g, f, address, _ = rng.choice([w for w in who if w[0] in (f"p{j}", f"n{j}")])
        doc = f"transcripts/call-{j}.md"
        (out / doc).write_text(f"---\nmeeting_id: call-{j}\nparticipants:\n  - \"{g} {f}\"\n"
                               f"---\n# Call {j}\n\n{g} {f} ({address}) went through the "
                               "week's numbers.\n")
        people[f"{doc}@{g} {f}"] = pid


def build(name: str) -> Path:
    seed, meetings = SETS[name]
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    truth: dict[str, dict[str, str]] = {"people": {}, "organizations": {}}
    _transcripts(Path(meetings), out, truth["people"])
    shutil.copy(QMSUM / "LICENSE", out / "LICENSE-QMSUM")  # the copied meetings' licence
    _contacts(seed, out, truth["people"], truth["organizations"])
    (out / "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True,
                                               ensure_ascii=False) + "\n")
    return out


if __name__ == "__main__":
    for name in SETS:
        print(build(name))
