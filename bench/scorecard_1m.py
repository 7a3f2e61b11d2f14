"""Score 1M generated SFT/DPO rows with the Polars scorecard, against a plain `json.loads` loop
that applies the same rules with the same hashes to a sample of the same corpus.

The corpus: half SFT, half DPO, 8 files a bucket; words drawn from the real 5,000-word
vocabulary of the QMSum meetings with their real (Zipf-shaped) frequencies
(bench/data/qmsum-words.tsv); planted exact duplicates, near duplicates (one word changed),
unparseable lines, rows with an e-mail address and DPO ties.

The baseline does the card's work row by row in plain Python: the same parse checks and rule
order, the same PII regex, the same blake2b-64 key hash for exact duplicates, the same 8
MinHashes (word hashes mixed with the next word's, 4 bands of 2) for near-duplicate candidates,
the same shortlist and exact Jaccard, the same split hash and digest. It runs on the sample
(the first rows of every file); the Polars card runs on the same sample too, and the two must
agree: the same count for every rule but near_duplicate, and near_duplicate within
NEAR_TOLERANCE. Only the word hash differs (Polars' own vs Python's `hash`), so LSH finds a few
different candidate pairs; the exact Jaccard decides as in the card. Each run is a process of
its own (its peak RSS is its own).

Targets (2 cores): Polars ≤ 15 s wall and ≤ 2 GB peak RSS on 1M rows, ≥ 10× the loop's rows/s.
    python bench/scorecard_1m.py [--rows 1000000] [--baseline-rows 50000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import ROOT, report

BUCKETS = {"engineering-pointsav": "sft", "apprenticeship-pointsav": "dpo"}
FILES_PER_BUCKET = 8
VOCABULARY = ROOT / "bench" / "data" / "qmsum-words.tsv"
NEAR_TOLERANCE = 0.02  # of the card's near-duplicate count: what another word hash may shift


def vocabulary() -> tuple[list[str], list[int]]:
    words, counts = [], []
    for line in VOCABULARY.read_text(encoding="utf-8").splitlines():
        w, n = line.split("\t")
        words.append(w)
        counts.append(int(n))
    return words, counts


class Words:
    """Words drawn with the vocabulary's frequencies, a million at a time (NumPy)."""

    def __init__(self, seed: int) -> None:
        import numpy as np

        self.np = np
        self.words, counts = vocabulary()
        p = np.array(counts, dtype=np.float64)
        self.p = p / p.sum()
        self.rng = np.random.default_rng(seed)
        self.used = np.zeros(len(self.words), dtype=bool)
        self.buf: list[str] = []
        self.pos = 0

    def sentence(self, n: int) -> str:
        if self.pos + n > len(self.buf):
            idx = self.rng.choice(len(self.words), size=1 << 20, p=self.p)
            self.used[idx] = True
            self.buf, self.pos = [self.words[i] for i in idx.tolist()], 0
        out = " ".join(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out.capitalize() + "."


def generate(root: Path, rows: int, seed: int = 7) -> dict[str, Any]:
    """Half SFT, half DPO, FILES_PER_BUCKET files each; 1% unparseable lines, 3% exact
    duplicates, 3% near duplicates (one word changed), 0.5% rows with an e-mail address, 0.5%
    of DPO rows ties (rejected = chosen in capitals); the rest clean-looking. Returns the
    planted counts and the vocabulary's size and use."""
    rng = random.Random(seed)
    words = Words(seed)
    planted = {"unparseable": 0, "exact_duplicate": 0, "near_duplicate": 0, "secrets_pii": 0,
               "chosen_equals_rejected": 0}
    for bucket, kind in BUCKETS.items():
        out = root / bucket
        out.mkdir(parents=True)
        files = [open(out / f"part-{i}.jsonl", "w", encoding="utf-8")
                 for i in range(FILES_PER_BUCKET)]
        recent: list[str] = []
        for i in range(rows // 2):
            f = files[i % FILES_PER_BUCKET]
            r = rng.random()
            if r < 0.01:
                f.write('{"prompt": "truncated\n')
                planted["unparseable"] += 1
                continue
            if r < 0.04 and recent:
                f.write(rng.choice(recent) + "\n")
                planted["exact_duplicate"] += 1
                continue
            q = words.sentence(rng.randint(10, 34))
            ans = words.sentence(rng.randint(16, 48))
            rejected = words.sentence(rng.randint(12, 36))
            if r < 0.07 and recent:
                base = json.loads(rng.choice(recent))
                text = base["messages"][1]["content"] if kind == "sft" else base["chosen"]
                ws = text.split()
                ws[len(ws) // 2] = "altered"
                ans = " ".join(ws)
                q = base["messages"][0]["content"] if kind == "sft" else base["prompt"]
                rejected = base.get("rejected", "")
                planted["near_duplicate"] += 1
            elif 0.07 <= r < 0.075:
                ans += f" Write to ann.lee{i}@example.com about it."
                planted["secrets_pii"] += 1
            elif 0.075 <= r < 0.08 and kind == "dpo":
                rejected = ans.upper()
                planted["chosen_equals_rejected"] += 1
            if kind == "sft":
                line = json.dumps({"messages": [{"role": "user", "content": q},
                                                {"role": "assistant", "content": ans}]})
            else:
                line = json.dumps({"prompt": q, "chosen": ans, "rejected": rejected})
            f.write(line + "\n")
            if r >= 0.08:
                recent.append(line)
                if len(recent) > 1000:
                    recent.pop(rng.randrange(len(recent)))
        for f in files:
            f.close()
    return {"planted": planted, "vocabulary_words": len(words.words),
            "vocabulary_words_used": int(words.used.sum())}


def sample(root: Path, out: Path, rows: int) -> None:
    """The first rows of every file (the same share of each), as a corpus of its own."""
    per_file = rows // (len(BUCKETS) * FILES_PER_BUCKET)
    for bucket in BUCKETS:
        (out / bucket).mkdir(parents=True)
        for path in sorted((root / bucket).glob("*.jsonl")):
            with path.open(encoding="utf-8") as src, \
                    (out / bucket / path.name).open("w", encoding="utf-8") as dst:
                for n, line in enumerate(src):
                    if n >= per_file:
                        break
                    dst.write(line)


def run_polars(root: Path) -> dict[str, Any]:
    from tasks.corpus.handoff import score_corpus
    from tasks.corpus.scorecard import ScorecardConfig

    t = time.perf_counter()
    cards, _ = score_corpus(root, dict(BUCKETS), ScorecardConfig())  # type: ignore[arg-type]
    wall = time.perf_counter() - t
    return {"wall_s": wall, "rows": sum(c.total for c in cards),
            "rules": {c.bucket: c.rules for c in cards},
            "digest": {c.bucket: c.digest for c in cards},
            "clean": {c.bucket: c.clean for c in cards},
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_loop(root: Path) -> dict[str, Any]:
    """The baseline: every bucket row by row in plain Python (see the module docstring)."""
    from tasks.corpus.scorecard import RULES, ScorecardConfig

    cfg = ScorecardConfig()
    t = time.perf_counter()
    out: dict[str, Any] = {"rows": 0, "rules": {}, "digest": {}, "clean": {}}
    for bucket, kind in BUCKETS.items():
        counts, stable, n = _loop_bucket(root / bucket, kind, cfg)
        out["rows"] += n
        out["rules"][bucket] = {r: counts.get(r, 0) for r in RULES}
        digest = hashlib.sha256(b"".join(h.to_bytes(8, "little") for h in sorted(stable)))
        out["digest"][bucket] = digest.hexdigest()
        out["clean"][bucket] = len(stable)
    out["wall_s"] = time.perf_counter() - t
    return out


def _contents(value: Any) -> list[str | None] | None:
    """A string field as one message's content, a list of messages as their contents; None
    when it is neither (wrong_schema). The implicit-prompt form is not in this corpus."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(m, dict) and isinstance(m.get("content"),
                                                                          str | None)
                                       for m in value):
        return [m.get("content") for m in value]
    return None


def _loop_bucket(path: Path, kind: str, cfg: Any) -> tuple[Counter[str], list[int], int]:
    from tasks.corpus.buckets import bucket_files, default_source
    from tasks.corpus.scorecard import (
        _KEY_DROP,
        _MASKS,
        _SEPARATORS,
        ANSWER_HEAD,
        BANDS,
        CHARS_PER_TOKEN,
        PII_PATTERNS,
        QUESTION_TAIL,
        ROWS_PER_BAND,
        _jaccard,
    )

    full = (1 << 64) - 1
    golden = 0x9E3779B97F4A7C15
    pii = re.compile("|".join(f"(?:{p})" for p in PII_PATTERNS.values()))
    key_table = str.maketrans({c: None for c in _KEY_DROP})
    sep_table = str.maketrans({c: " " for c in _SEPARATORS})
    cols = ["messages"] if kind == "sft" else ["prompt", "chosen", "rejected"]
    counts: Counter[str] = Counter()
    by_source: Counter[tuple[str, bool]] = Counter()  # the card's composition table
    seen: set[bytes] = set()
    clean: list[tuple[int, str, list[int], str]] = []  # (stable hash, norm, signature, source)
    n = 0
    for file in bucket_files(path):
        source = default_source(path, file)
        data = file.read_bytes()
        try:
            lines: list[str | None] = list(data.decode("utf-8").split("\n"))
        except UnicodeDecodeError:
            lines = [_utf8(raw) for raw in data.split(b"\n")]
        for raw in lines:
            if raw is None:
                n += 1
                counts["invalid_utf8"] += 1
                by_source[(source, False)] += 1
                continue
            if not raw.strip():
                continue
            n += 1
            status, row = None, None
            s = raw.strip()
            if not (s.startswith("{") and s.endswith("}")):
                status = "unparseable"
            else:
                try:
                    row = json.loads(raw)
                except ValueError:
                    status = "unparseable"
            if status is None and not isinstance(row, dict):
                status = "unparseable"
            turns: dict[str, list[str | None] | None] = {}
            if status is None:
                assert isinstance(row, dict)
                if kind == "sft":
                    p, c = row.get("prompt"), row.get("completion")
                    turns["messages"] = _contents(row["messages"]) \
                        if isinstance(row.get("messages"), list) \
                        else [p, c] if isinstance(p, str) and isinstance(c, str) else None
                else:
                    turns = {c: _contents(row.get(c)) for c in cols}
                if not all(turns.get(c) for c in cols):
                    status = "wrong_schema"
            if status is not None:
                counts[status] += 1
                by_source[(source, False)] += 1
                continue
            t_ = {c: turns[c] or [] for c in cols}
            if isinstance(row.get("source"), str):  # type: ignore[union-attr]
                source = row["source"]  # type: ignore[index]
            text = "\n".join("\n".join(x for x in t_[c] if x is not None) for c in cols)
            key = text.lower().translate(key_table).encode()
            h = hashlib.blake2b(key, digest_size=8).digest()
            if any(not (x or "").strip() for c in cols for x in t_[c]):
                status = "empty_turn"
            elif (tokens := sum(len(x) for c in cols for x in t_[c] if x) / CHARS_PER_TOKEN) \
                    < cfg.min_tokens:
                status = "too_short"
            elif tokens > cfg.max_tokens:
                status = "too_long"
            elif kind == "dpo" and _key_of(t_["chosen"], key_table) == \
                    _key_of(t_["rejected"], key_table):
                status = "chosen_equals_rejected"
            elif pii.search(text):
                status = "secrets_pii"
            elif h in seen:
                status = "exact_duplicate"
            seen.add(h)
            if status is not None:
                counts[status] += 1
                by_source[(source, False)] += 1
                continue
            if kind == "sft":
                m = t_["messages"]
                pair = [(m[-2] if len(m) > 1 else None) or "", m[-1] or ""]
            else:
                pair = [t_["prompt"][-1] or "",
                        " ".join(x for x in t_["chosen"] if x is not None),
                        " ".join(x for x in t_["rejected"] if x is not None)]
            norm = " ".join([pair[0][-QUESTION_TAIL:], *(a[:ANSWER_HEAD] for a in pair[1:])]) \
                .lower().translate(sep_table)
            hs = [hash(w) & full for w in norm.split(" ") if w]
            mixed = [a ^ ((b * golden) & full) for a, b in zip(hs, hs[1:], strict=False)]
            mixed += hs[-1:]
            sig = [min(x ^ mask for x in mixed) for mask in _MASKS] if mixed else [0] * len(_MASKS)
            clean.append((int.from_bytes(h, "little"), norm, sig, source))
    # The near-duplicate pass over the rows still clean, in row order: banded candidates (each
    # row against its bucket's first row and its predecessor there), the signature shortlist,
    # the exact Jaccard.
    first: dict[tuple[int, int, int], int] = {}
    last: dict[tuple[int, int, int], int] = {}
    near = set()
    for i, (_, norm, sig, _) in enumerate(clean):
        cands = set()
        for b in range(BANDS):
            k = (b, *sig[b * ROWS_PER_BAND:(b + 1) * ROWS_PER_BAND])
            if k in first:
                cands.update((first[k], last[k]))
            else:
                first[k] = i
            last[k] = i
        for j in cands:
            agree = sum(a == b for a, b in zip(sig, clean[j][2], strict=True)) / len(_MASKS)
            if agree >= cfg.near_duplicate_threshold - 0.35 and \
                    _jaccard(norm, clean[j][1]) >= cfg.near_duplicate_threshold:
                near.add(i)
                break
    counts["near_duplicate"] = len(near)
    stable = []
    for i, (h, _, _, source) in enumerate(clean):
        by_source[(source, i not in near)] += 1
        if i not in near:
            stable.append(h)
    # The card splits the clean rows into train and eval by the same stable hash.
    split = Counter(h % 10_000 < int(cfg.eval_share * 10_000) for h in stable)
    assert split[True] + split[False] == len(stable)
    return counts, stable, n


def _key_of(contents: list[str | None], table: dict[int, Any]) -> str:
    return "\n".join(x for x in contents if x is not None).lower().translate(table)


def _utf8(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def agrees(card: dict[str, dict[str, int]], loop: dict[str, dict[str, int]]) -> bool:
    """Whether the loop found what the card found, bucket by bucket (see NEAR_TOLERANCE)."""
    for bucket, rules in card.items():
        for rule, n in rules.items():
            m = loop[bucket][rule]
            if m != n and (rule != "near_duplicate" or abs(m - n) > NEAR_TOLERANCE * n):
                return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--baseline-rows", type=int, default=50_000)
    ap.add_argument("--mode", choices=["all", "polars", "loop"], default="all")
    ap.add_argument("--root", type=Path)
    args = ap.parse_args()
    if args.mode != "all":
        print(json.dumps(run_polars(args.root) if args.mode == "polars" else run_loop(args.root)))
        return
    root = Path(tempfile.mkdtemp(prefix="bench-scorecard-"))
    try:
        t = time.perf_counter()
        made = generate(root / "full", args.rows)
        gen_s = time.perf_counter() - t
        sample(root / "full", root / "sample", args.baseline_rows)
        size = sum(p.stat().st_size for p in (root / "full").rglob("*.jsonl"))

        def child(mode: str, corpus: Path) -> dict[str, Any]:
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--mode", mode,
                                   "--root", str(corpus)],
                                  capture_output=True, text=True, cwd=ROOT, check=True)
            return json.loads(proc.stdout.strip().splitlines()[-1])

        fast = child("polars", root / "full")
        fast_sample = child("polars", root / "sample")
        loop = child("loop", root / "sample")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    fast_rate = fast["rows"] / fast["wall_s"]
    sample_rate = fast_sample["rows"] / fast_sample["wall_s"]
    loop_rate = loop["rows"] / loop["wall_s"]
    found = Counter()
    for rules in fast["rules"].values():
        found.update(rules)
    agree = agrees(fast_sample["rules"], loop["rules"])
    report({"bench": "scorecard_1m", "rows": fast["rows"], "corpus_mb": round(size / 1e6),
            "generate_s": round(gen_s, 1), **made,
            "found": {k: found[k] for k in made["planted"]},
            "polars_wall_s": round(fast["wall_s"], 2),
            "polars_peak_rss_mb": round(fast["peak_rss_mb"]),
            "polars_rows_per_s": round(fast_rate),
            "sample_rows": loop["rows"], "sample_polars_wall_s": round(fast_sample["wall_s"], 2),
            "sample_polars_rows_per_s": round(sample_rate),
            "sample_loop_wall_s": round(loop["wall_s"], 2), "loop_rows_per_s": round(loop_rate),
            "loop_agrees_with_polars": agree,
            "sample_rules": {"polars": fast_sample["rules"], "loop": loop["rules"]},
            "speedup_vs_loop": round(fast_rate / loop_rate, 1),
            "speedup_vs_loop_same_rows": round(sample_rate / loop_rate, 1),
            "targets": {"polars_wall_s": "<= 15", "polars_peak_rss_mb": "<= 2048",
                        "speedup_vs_loop": ">= 10", "loop_agrees_with_polars": "true",
                        "near_duplicate_tolerance": NEAR_TOLERANCE}})
    if not agree:
        sys.exit("scorecard_1m: the loop and the Polars card disagree on the sample — the "
                 "baseline no longer does the same work; see sample_rules above")


if __name__ == "__main__":
    main()
