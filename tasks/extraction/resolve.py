"""Entity resolution: canonical keys from type + normalised name.

"Hon. Anita Anand (Minister of Public Services and Procurement)" and "Hon. Anita Anand" are
one Person: honorifics and post-nominals are dropped from the key, a trailing parenthetical
becomes the affiliation, and every spelling seen is kept as an alias. "Northwind Analytics,
Inc.", "Northwind Analytics Inc." and "The Northwind Analytics" are one Organization: a
leading "The", a trailing legal form and the difference between `&` and "and" are dropped
from its key. People who share a name but not an e-mail address are kept apart where the
contacts are read (tasks/extraction/rows.py `contact_rows`), unless a phone number agrees
(`phone_key`).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

_HONORIFICS = (
    "the right honourable", "the honourable", "right honourable", "right hon.", "right hon",
    "rt. hon.", "rt hon", "hon.",
    "hon", "mr.", "mr", "mrs.", "mrs", "ms.", "ms", "miss", "mx.", "dr.", "dr", "prof.", "prof",
    "sir", "dame", "senator",
)
# Post-nominals written in capitals after a name ("Kirsty Williams AM", "Jane Doe MP").
_POSTNOMINALS = {"AM", "MS", "MP", "MLA", "MSP", "MPP", "QC", "KC", "PHD", "MBE", "OBE", "CBE"}
_ROLE_PREFIX = re.compile(r"^(the\s+)?(acting\s+)?(deputy\s+)?(chair|speaker|clerk)\b", re.I)
_WS = re.compile(r"\s+")


@dataclass(frozen=True)
class ResolvedName:
    name: str  # display name without honorific, post-nominals or affiliation
    affiliation: str | None
    role: str | None
    raw: str


def _split_trailing_paren(s: str) -> tuple[str, str | None]:
    """'A (B (C))' -> ('A', 'B (C)'); parentheses may nest."""
    if not s.endswith(")"):
        return s, None
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                return s[:i].rstrip(), s[i + 1 : -1].strip()
    return s, None


def _strip_honorifics(s: str) -> str:
    changed = True
    while changed:
        changed = False
        low = s.lower()
        for h in _HONORIFICS:
            if low.startswith(h + " ") or (h.endswith(".") and low.startswith(h)):
                s = s[len(h):].lstrip()
                changed = True
                break
    return s


def _strip_postnominals(s: str) -> str:
    parts = s.split(" ")
    while len(parts) > 1 and parts[-1].replace(".", "").upper() in _POSTNOMINALS and \
            parts[-1].replace(".", "").isupper():
        parts.pop()
    return " ".join(parts)


def split_name(raw: str, person: bool = True) -> ResolvedName:
    """Separate a written name into name, affiliation and role."""
    s = _WS.sub(" ", unicodedata.normalize("NFKC", raw)).strip()
    outer, inner = _split_trailing_paren(s)
    role = None
    affiliation = None
    if inner is not None:
        # "The Acting Chair (Mr. Bruce Stanton)": the parenthetical is the person.
        if person and _ROLE_PREFIX.match(outer) and _strip_honorifics(inner) != inner:
            role, s = outer, inner
            s, affiliation = _split_trailing_paren(s)
        else:
            s, affiliation = outer, inner
    if person:
        s = _strip_postnominals(_strip_honorifics(s))
    return ResolvedName(name=s.strip() or raw.strip(), affiliation=affiliation, role=role, raw=raw)


def normalize(name: str) -> str:
    """Case-, accent- and whitespace-insensitive form of a name."""
    decomposed = unicodedata.normalize("NFKD", name)
    s = "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()
    s = re.sub(r"[^\w\s'&-]", " ", s)
    return _WS.sub(" ", s).strip()


# Legal forms that end an organization's name, as normalize() writes them ("S.A." → "s a"),
# longest first; "Pty Ltd" and "Co., Ltd." lose both words.
_LEGAL_FORMS = sorted((tuple(f.split()) for f in (
    "inc", "incorporated", "ltd", "limited", "llc", "l l c", "llp", "corp", "corporation", "co",
    "company", "gmbh", "ag", "sa", "s a", "plc", "pty", "bv", "b v", "nv", "n v", "srl",
    "s r l", "sas", "s a s", "oy", "ab", "kk")), key=len, reverse=True)


def organization_name_key(name: str) -> str:
    """The part of an organization's name its key is made of: normalised, without a leading
    "the" or trailing legal forms, `&` as "and" ('The Procter & Gamble Co.' → 'procter and
    gamble'); never empty ('The Limited' → 'limited', 'Co' → 'co')."""
    words = normalize(name).replace("&", " and ").split()
    core = words[1:] if words[:1] == ["the"] and len(words) > 1 else words
    while True:
        form = next((f for f in _LEGAL_FORMS if len(core) > len(f) and
                     tuple(core[-len(f):]) == f), None)
        if form is None:
            break
        core = core[:-len(form)]
    return " ".join(core) if core else " ".join(words)


def phone_key(raw: str) -> str | None:
    """What two spellings of one phone number share: its last eight digits ("+1 (555)
    010-0100" and "555.010.0100" → "50100100"; "+44 20 7946 0958" and "020 7946 0958" →
    "79460958": a country code or trunk 0 drops out, whatever its length); None under eight
    digits (an extension, a typo). Two numbers that end alike collide: a phone is compared only
    among the Persons of one name, and the candidates of one document."""
    digits = re.sub(r"\D", "", raw)
    return digits[-8:] if len(digits) >= 8 else None


_PHONE_IN_TEXT = re.compile(r"\+?\d[\d ().-]{5,}\d")


def phones_in(text: str) -> set[str]:
    """The phone keys of the numbers written in `text`."""
    return {k for m in _PHONE_IN_TEXT.finditer(text) if (k := phone_key(m.group()))}


# Common English nicknames and the given names they stand for (normalised), for joins that
# agreeing evidence backs (`variant_of`); a name may stand for several.
_NICKNAMES = {
    "bob": {"robert"}, "rob": {"robert"}, "robbie": {"robert"}, "bobby": {"robert"},
    "bill": {"william"}, "will": {"william"}, "billy": {"william"}, "liam": {"william"},
    "jim": {"james"}, "jimmy": {"james"}, "jamie": {"james"}, "mike": {"michael"},
    "mick": {"michael"}, "dave": {"david"}, "steve": {"stephen", "steven"},
    "tom": {"thomas"}, "tommy": {"thomas"}, "chris": {"christopher", "christine", "christina"},
    "dan": {"daniel"}, "danny": {"daniel"}, "joe": {"joseph"}, "sam": {"samuel", "samantha"},
    "ben": {"benjamin"}, "alex": {"alexander", "alexandra"}, "andy": {"andrew"},
    "drew": {"andrew"}, "tony": {"anthony"}, "nick": {"nicholas"}, "matt": {"matthew"},
    "pat": {"patrick", "patricia"}, "ed": {"edward"}, "ted": {"edward"}, "rick": {"richard"},
    "dick": {"richard"}, "kate": {"katherine", "catherine"}, "katie": {"katherine"},
    "cathy": {"catherine"}, "liz": {"elizabeth"}, "beth": {"elizabeth"},
    "betty": {"elizabeth"}, "jen": {"jennifer"}, "jenny": {"jennifer"},
    "meg": {"margaret"}, "maggie": {"margaret"}, "peggy": {"margaret"}, "sue": {"susan"},
    "becky": {"rebecca"}, "vicky": {"victoria"}, "debbie": {"deborah"}, "jess": {"jessica"},
    "greg": {"gregory"}, "jeff": {"jeffrey"}, "ken": {"kenneth"}, "larry": {"lawrence"},
    "tim": {"timothy"}, "fred": {"frederick"}, "charlie": {"charles"}, "chuck": {"charles"},
}


def variant_of(a: str, b: str) -> str | None:
    """How the person's name `a` can be a shorter spelling of `b` — "initial" ("P. Raman" of
    "Priya Raman"), "nickname" ("Bob Smith" of "Robert Smith") — or None: the same family
    name, `a`'s given name the initial of `b`'s or a nickname of it. One way only, so that two
    spellings never join each other: "Priya Raman" is no variant of "P. Raman". Only agreeing
    evidence may join such a pair (tasks/extraction/answers.py `_colleague`)."""
    x, y = normalize(a).split(), normalize(b).split()
    if len(x) < 2 or len(y) < 2 or x[-1] != y[-1]:
        return None
    if len(x[0]) == 1 < len(y[0]) and x[0] == y[0][0]:
        return "initial"
    if y[0] in _NICKNAMES.get(x[0], ()):
        return "nickname"
    return None


def entity_key(entity_type: str, name: str) -> str:
    """Canonical key: 'Person:anita anand', 'Organization:northwind analytics'. `name` must
    already be cleaned by split_name."""
    if entity_type == "Organization":
        return f"{entity_type}:{organization_name_key(name)}"
    return f"{entity_type}:{normalize(name)}"


def resolve(entity_type: str, raw: str) -> tuple[str, ResolvedName]:
    resolved = split_name(raw, person=entity_type == "Person")
    return entity_key(entity_type, resolved.name), resolved


_ROLE_NAMES = {
    "project manager", "industrial designer", "user interface", "marketing", "the chair",
}


def looks_like_person_name(raw: str) -> bool:
    """A transcript participant that names a person, not a role such as 'Grad A'."""
    r = split_name(raw)
    if r.name != raw.strip():  # an honorific, post-nominal, affiliation or role came off
        return True
    words = r.name.split()
    return len(words) >= 2 and all(w[:1].isupper() and len(w) > 1 for w in words) and \
        r.name.lower() not in _ROLE_NAMES
