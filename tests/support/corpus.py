"""Corpus buckets the scorecard tests write: bucket names, SFT and DPO rows, questions and
answers distinct enough to pass the near-duplicate rule."""

import gzip
import json
from pathlib import Path

ENG, APP = "engineering-pointsav", "apprenticeship-pointsav"


def sft(q: str, a: str, **extra: object) -> str:
    return json.dumps({"messages": [{"role": "user", "content": q},
                                    {"role": "assistant", "content": a}], **extra})


def dpo(p: str, c: str, r: str, **extra: object) -> str:
    return json.dumps({"prompt": p, "chosen": c, "rejected": r, **extra})


def write(path: Path, lines: list[str] | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = lines if isinstance(lines, bytes) else ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)


def q(i: int) -> str:
    return f"Question number {i} about the design review of component {i * 7} in the plant?"


def a(i: int) -> str:
    return f"Answer {i}: the review approved part {i * 13} after testing batch {i * 3}."
