"""The gold set: one JSON object a line, each a chunk of text with the facts it states.

A `complete` case lists every entity and relationship of its text, so a prediction missing
from it is wrong (precision and recall); an incomplete one lists some (recall only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tasks.shared.errors import ConfigError
from tasks.shared.files import sha256_hex

Split = Literal["train", "validation", "examples"]
SPLITS: tuple[Split, ...] = get_args(Split)
DEFAULT_GOLD = Path(__file__).resolve().parents[2] / "evals" / "extraction" / "gold.jsonl"


class GoldEntity(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    type: str
    name: str
    aliases: list[str] = []
    kind: str = ""  # how the gold knows it (speaker, surname, party, organisation, …)


class GoldRelationship(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str  # a GoldEntity id of the same case
    type: str
    target: str
    kind: str = ""


class GoldCase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    split: Split
    source: str = ""
    complete: bool = False
    stream: str = "research"
    title: str = ""
    text: str = Field(min_length=1)
    entities: list[GoldEntity] = []
    relationships: list[GoldRelationship] = []

    @model_validator(mode="after")
    def _ids(self) -> GoldCase:
        ids = [e.id for e in self.entities]
        if len(set(ids)) != len(ids):
            raise ValueError(f"case {self.id}: an entity id is used twice")
        for r in self.relationships:
            for end in (r.source, r.target):
                if end not in ids:
                    raise ValueError(f"case {self.id}: relationship {r.source} {r.type} "
                                     f"{r.target} names {end!r}, not an entity of the case")
        return self


def load_gold(path: Path, split: Split | Literal["all"] = "all") -> tuple[list[GoldCase], str]:
    """The cases of `split` ("all": every case) in file order, and the file's sha256 (16 hex).
    ConfigError for a missing file, a bad line, a repeated id or a split with no case."""
    if not path.is_file():
        raise ConfigError(f"gold set {path} not found — pass --gold FILE (one JSON case a line, "
                          "see evals/extraction/README.md)")
    raw = path.read_bytes()
    cases: list[GoldCase] = []
    for n, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            cases.append(GoldCase.model_validate(json.loads(line)))
        except (ValueError, ValidationError) as e:
            raise ConfigError(f"gold set {path}, line {n}: not a valid case ({e}) — fix the "
                              "line or rebuild the gold set") from None
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        dupe = next(i for i in ids if ids.count(i) > 1)
        raise ConfigError(f"gold set {path}: case id {dupe!r} appears twice")
    chosen = [c for c in cases if split == "all" or c.split == split]
    if not chosen:
        have = sorted({c.split for c in cases})
        raise ConfigError(f"gold set {path}: no case in split {split!r} (splits there: "
                          f"{', '.join(have) or 'none'})")
    return chosen, sha256_hex(raw, 16)
