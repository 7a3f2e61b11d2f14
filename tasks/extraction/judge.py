"""The judge (issue 52, item 4): a name alone that several Persons of that name hold, which its
document's evidence does not settle (tasks/extraction/answers.py `_fitting`: an address in the
text, an employer among the document's organizations), goes to the serving model with the
passages where the name occurs and each candidate's evidence. The schema asks for the reasons
before the answer — Graphiti's dedup judge went from 7 to 14 of 15 with a reasoning-first
schema (getzep/graphiti#1666) — and the answer is one candidate's key or "none", held to that
enum. A link the judge makes is a join like any other (`graph merges` lists it with the
reasons, `graph split` undoes it); "none", or no usable answer after the client's retries,
leaves the name linked to no one and listed with the reasons.

`[extraction] judge = true` turns it on (production's profile); it is off locally, where
SmolLM2 would only guess.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tasks.extraction.calls import run_sync
from tasks.extraction.documents import Document
from tasks.extraction.llm import LLMClient
from tasks.extraction.schema import SchemaViolation
from tasks.shared.errors import Deferred, LLMError

NONE = "none"
PASSAGES = 3  # of the document, where the name occurs
PASSAGE_CHARS = 600
MAX_REASONS = 600

SYSTEM = (
    "A document names a person, and the knowledge graph holds several people of that name. "
    "Decide which one the document means. First give your reasons: what the passages say "
    "about the person, and which candidate's e-mail addresses or employers agree or conflict "
    "with it. Then answer with that candidate's key, or \"none\" when the passages do not "
    "tell the candidates apart. Never guess: a wrong link merges two people's facts.")


@dataclass(frozen=True)
class Candidate:
    """A Person a name alone could be: its key, and the evidence a document's context meets —
    its e-mail addresses, the keys of the organizations it works for, its phones' keys
    (tasks/extraction/resolve.py phone_key)."""

    key: str
    emails: frozenset[str] = frozenset()
    employers: frozenset[str] = frozenset()
    phones: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Verdict:
    key: str | None  # the candidate chosen; None: none of them, or no usable answer
    reasons: str


def schema(keys: list[str]) -> dict[str, Any]:
    """Reasons first, then the answer: one of `keys` or "none"."""
    return {"type": "object", "additionalProperties": False,
            "properties": {"reasons": {"type": "string", "minLength": 1,
                                       "maxLength": MAX_REASONS},
                           "answer": {"type": "string", "enum": [*keys, NONE]}},
            "required": ["reasons", "answer"]}


def passages(text: str, name: str) -> list[str]:
    """Up to PASSAGES windows of the text around the name's occurrences (case-insensitive);
    the document's beginning when the name does not occur as written."""
    found = [m.start() for m in re.finditer(re.escape(name), text, re.I)][:PASSAGES]
    half = PASSAGE_CHARS // 2
    return [text[max(0, at - half):at + half].strip() for at in found] or \
        [text[:PASSAGE_CHARS].strip()]


def prompt(doc: Document, name: str, candidates: list[Candidate]) -> str:
    """The user message: the name, the passages, each candidate's key and evidence."""
    lines = [f"Name: {name}", f"Document: {doc.id}", "", "Passages:"]
    lines += [f"---\n{p}" for p in passages(doc.text, name)]
    lines += ["---", "", "Candidates:"]
    for c in candidates:
        emails = ", ".join(sorted(c.emails)) or "none known"
        employers = ", ".join(sorted(e.split(":", 1)[-1] for e in c.employers)) or "none known"
        lines.append(f"- {c.key}: e-mail {emails}; works for {employers}")
    return "\n".join(lines)


def reader(keys: list[str]) -> Any:
    """What takes the model's JSON: a Verdict, or SchemaViolation (the client resends)."""
    def read(data: Any) -> Verdict:
        if not isinstance(data, dict) or set(data) != {"reasons", "answer"}:
            raise SchemaViolation("", "required", "want exactly reasons and answer, got "
                                  f"{json.dumps(data)[:200]}")
        reasons, answer = data["reasons"], data["answer"]
        if not isinstance(reasons, str) or not reasons.strip():
            raise SchemaViolation("reasons", "minLength", "no reasons given")
        if answer not in (*keys, NONE):
            raise SchemaViolation("answer", "enum", f"{str(answer)[:100]!r} is neither a "
                                  "candidate nor none")
        return Verdict(None if answer == NONE else answer, reasons.strip()[:MAX_REASONS])
    return read


@dataclass
class Judge:
    """Asks `client` once per (document, name); a later ask (a batch written again after a
    graph error) gets the same verdict."""

    client: LLMClient
    verdicts: dict[tuple[str, str], Verdict] = field(default_factory=dict)

    def __call__(self, doc: Document, name: str, candidates: list[Candidate]) -> Verdict:
        if (doc.id, name) not in self.verdicts:
            self.verdicts[doc.id, name] = self._ask(doc, name, candidates)
        return self.verdicts[doc.id, name]

    def _ask(self, doc: Document, name: str, candidates: list[Candidate]) -> Verdict:
        keys = [c.key for c in candidates]
        body = self.client.request_body(SYSTEM, prompt(doc, name, candidates), schema(keys))

        async def ask() -> Verdict:
            async with self.client:
                verdict: Verdict = await self.client.ask(body, reader(keys))
                return verdict

        try:
            return run_sync(ask())  # type: ignore[no-any-return]
        except (LLMError, Deferred) as e:
            return Verdict(None, f"no verdict: {e}")
