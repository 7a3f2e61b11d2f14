"""Score 1M generated SFT/DPO rows (~0.5 GB) with the Polars scorecard, against a plain
`json.loads` loop applying the same rules to a 50k-row sample of the same corpus.

Targets (2 cores): ≤ 15 s wall, ≤ 2 GB peak RSS, ≥ 10× the loop's rows/s.
    python bench/scorecard_1m.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, report

# A realistic vocabulary size: with a few dozen words every text shares most bigrams.
WORDS = ["".join(random.Random(i).choice("abcdefghijklmnoprstuvwy") for _ in range(3 + i % 7))
         for i in range(5000)]


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def generate(root: Path, rows: int, seed: int = 7) -> dict[str, int]:
    """Half SFT, half DPO, 8 sources each; 3% exact duplicates, 3% near duplicates (one word
    changed), 1% unparseable lines, the rest clean-looking. Returns the planted counts."""
    rng = random.Random(seed)
    planted = {"exact_duplicate": 0, "near_duplicate": 0, "unparseable": 0}
    for bucket, kind in (("engineering-pointsav", "sft"), ("apprenticeship-pointsav", "dpo")):
        out = root / bucket
        out.mkdir(parents=True)
        files = [open(out / f"part-{i}.jsonl", "w", encoding="utf-8") for i in range(8)]
        recent: list[str] = []
        for i in range(rows // 2):
            f = files[i % 8]
            r = rng.random()
            if r < 0.01:
                f.write('{"prompt": "truncated\n')
                planted["unparseable"] += 1
                continue
            if r < 0.04 and recent:
                f.write(rng.choice(recent) + "\n")
                planted["exact_duplicate"] += 1
                continue
            q, ans, rejected = sentence(rng, 22), sentence(rng, 32), sentence(rng, 24)
            if r < 0.07 and recent:
                base = json.loads(rng.choice(recent))
                text = base["messages"][1]["content"] if kind == "sft" else base["chosen"]
                words = text.split()
                words[len(words) // 2] = "altered"
                ans = " ".join(words)
                q = base["messages"][0]["content"] if kind == "sft" else base["prompt"]
                rejected = base.get("rejected", "")
                planted["near_duplicate"] += 1
            if kind == "sft":
                line = json.dumps({"messages": [{"role": "user", "content": q},
                                                {"role": "assistant", "content": ans}]})
            else:
                line = json.dumps({"prompt": q, "chosen": ans, "rejected": rejected})
            f.write(line + "\n")
            if r >= 0.07:
                recent.append(line)
                if len(recent) > 1000:
                    recent.pop(rng.randrange(len(recent)))
        for f in files:
            f.close()
    return planted


def run_polars(root: Path) -> dict:
    from tasks.corpus.phase2 import score_corpus
    from tasks.corpus.scorecard import ScorecardConfig

    t = time.perf_counter()
    cards, _ = score_corpus(root, {"engineering-pointsav": "sft",
                                   "apprenticeship-pointsav": "dpo"}, ScorecardConfig())
    wall = time.perf_counter() - t
    rows = sum(c.total for c in cards)
    rules: dict[str, int] = {}
    for c in cards:
        for k, v in c.rules.items():
            rules[k] = rules.get(k, 0) + v
    return {"wall_s": wall, "rows": rows, "rules": rules,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


PII = [re.compile(p) for p in (
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    r"(?:\+\d{1,3}[ .-]?)?(?:\(\d{2,4}\)|\d{2,4})[ .-]\d{3,4}[ .-]\d{3,4}\b",
    r"\b(?:sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16})", r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")]


def run_loop(root: Path, limit: int) -> dict:
    """The baseline: json.loads per line, the same rules in plain Python (near duplicates with
    the same word-bigram MinHash over the pair text, 16 hashes, banded)."""
    t = time.perf_counter()
    seen: set[str] = set()
    bands: dict[tuple, int] = {}
    n = 0
    counts: dict[str, int] = {}
    for bucket in ("engineering-pointsav", "apprenticeship-pointsav"):
        for path in sorted((root / bucket).glob("*.jsonl")):
            for line in path.open(encoding="utf-8"):
                if n >= limit:
                    break
                n += 1
                try:
                    row = json.loads(line)
                except ValueError:
                    counts["unparseable"] = counts.get("unparseable", 0) + 1
                    continue
                turns = row.get("messages") or [{"content": row.get(k)} for k in
                                                 ("prompt", "chosen", "rejected")]
                texts = [t_.get("content") or "" for t_ in turns]
                if any(not x.strip() for x in texts):
                    continue
                text = "\n".join(texts)
                if len(text) / 3.5 < 8 or len(text) / 3.5 > 8192:
                    continue
                if "chosen" in row and row["chosen"].lower().split() == row["rejected"].lower().split():
                    continue
                if any(p.search(text) for p in PII):
                    continue
                norm = " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())
                h = hashlib.blake2b(norm.encode(), digest_size=8).digest()
                if h in seen:
                    counts["exact_duplicate"] = counts.get("exact_duplicate", 0) + 1
                    continue
                seen.add(h)
                if "messages" in row:
                    pair = texts[-2][-300:] + " " + texts[-1][:600]
                else:
                    pair = " ".join((texts[0][-300:], texts[1][:600], texts[2][:600]))
                words = " ".join(re.sub(r"[^\w]+", " ", pair.lower()).split()).split()
                sh = [hash(a + " " + b) for a, b in zip(words, words[1:], strict=False)]
                sig = [min((x ^ m) & 0xFFFFFFFFFFFFFFFF for x in sh) for m in range(16)]
                dup = False
                for b in range(8):
                    key = (b, sig[2 * b], sig[2 * b + 1])
                    if key in bands:
                        dup = True
                    bands.setdefault(key, n)
                if dup:
                    counts["near_duplicate"] = counts.get("near_duplicate", 0) + 1
    return {"wall_s": time.perf_counter() - t, "rows": n, "rules": counts}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--baseline-rows", type=int, default=50_000)
    ap.add_argument("--mode", choices=["all", "polars", "loop"], default="all")
    ap.add_argument("--root", type=Path)
    args = ap.parse_args()
    if args.mode != "all":
        out = run_polars(args.root) if args.mode == "polars" else \
            run_loop(args.root, args.baseline_rows)
        print(json.dumps(out))
        return
    root = Path(tempfile.mkdtemp())
    t = time.perf_counter()
    planted = generate(root, args.rows)
    gen_s = time.perf_counter() - t
    size = sum(p.stat().st_size for p in root.rglob("*.jsonl"))

    def child(mode: str) -> dict:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--mode", mode,
                               "--root", str(root), "--baseline-rows", str(args.baseline_rows)],
                              capture_output=True, text=True, cwd=ROOT, check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    fast, loop = child("polars"), child("loop")
    fast_rate, loop_rate = fast["rows"] / fast["wall_s"], loop["rows"] / loop["wall_s"]
    report({"bench": "scorecard_1m", "rows": fast["rows"], "corpus_mb": round(size / 1e6),
            "generate_s": round(gen_s, 1), "planted": planted,
            "polars_wall_s": round(fast["wall_s"], 2),
            "polars_peak_rss_mb": round(fast["peak_rss_mb"]),
            "polars_rules": fast["rules"], "polars_rows_per_s": round(fast_rate),
            "loop_rows": loop["rows"], "loop_rows_per_s": round(loop_rate),
            "speedup_vs_loop": round(fast_rate / loop_rate, 1),
            "targets": {"polars_wall_s": "<= 15", "polars_peak_rss_mb": "<= 2048",
                        "speedup_vs_loop": ">= 10"}})
    subprocess.run(["rm", "-rf", str(root)], check=False)


if __name__ == "__main__":
    main()
