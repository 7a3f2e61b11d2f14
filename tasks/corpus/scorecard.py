"""The composition scorecard: named Polars rules over a bucket; their failure counts ARE the card.

Each row is charged to the first rule it fails, in RULES order, so the counts add up:
total = clean + Σ failures. Duplicates are looked for only among rows that passed the earlier
rules. A bucket passes when clean ≥ floor and its composition caps hold.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, Self

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.corpus.buckets import Kind, bucket_files, empty_bucket, read_file
from tasks.records import BucketScore, Scorecard, SourceShare
from tasks.shared.files import sha256_hex

SCORECARD_VERSION = 1
CLEAN_PAIR_FLOOR = 3000
RULES = ("invalid_utf8", "unparseable", "wrong_schema", "empty_turn", "too_short", "too_long",
         "chosen_equals_rejected", "secrets_pii", "exact_duplicate", "near_duplicate")
CHARS_PER_TOKEN = 3.5
FILE_WORKERS = 2  # files scored at once

PII_PATTERNS = {
    "email": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    "phone": r"(?:\+\d{1,3}[ .-]?)?(?:\(\d{2,4}\)|\d{2,4})[ .-]\d{3,4}[ .-]\d{3,4}\b",
    "api_key": r"\b(?:sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{36,}|"
               r"xox[baprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35})",
    "private_key": r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----",
}


class ScorecardConfig(BaseModel):
    """Bounds and policies; every field has a default an operator can override (the profile's
    [corpus] table: tasks/profile.py CorpusSettings adds where the corpus is)."""

    model_config = ConfigDict(extra="forbid")
    floor: int = Field(default=CLEAN_PAIR_FLOOR, ge=0, description="CLEAN_PAIR_FLOOR: clean "
                       "pairs a bucket needs to train.")
    min_tokens: int = Field(default=8, ge=0, description="Estimated tokens of a whole row.")
    max_tokens: int = Field(default=8192, ge=1, description="More than min_tokens.")
    near_duplicate_threshold: float = Field(default=0.8, gt=0, le=1, description="Estimated "
                                            "Jaccard of word-bigram sets.")
    pii_policy: Literal["drop", "flag"] = "drop"
    max_source_share: float = Field(default=0.5, gt=0, le=1, description="Of a bucket's clean "
                                    "rows.")
    min_sources: int = Field(default=1, ge=1)
    eval_share: float = Field(default=0.05, ge=0, lt=1)

    @model_validator(mode="after")
    def _token_bounds(self) -> Self:
        if self.max_tokens <= self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be more than min_tokens "
                             f"({self.min_tokens})")
        return self

    def rules_only(self, floor: int | None = None) -> ScorecardConfig:
        """These bounds alone (a subclass's other fields left out), `floor` overriding."""
        fields = {k: getattr(self, k) for k in ScorecardConfig.model_fields}
        return ScorecardConfig(**fields | ({} if floor is None else {"floor": floor}))


def _text(cols: list[str]) -> pl.Expr:
    """All message contents of a row as one string (roles do not matter to the rules)."""
    parts = [pl.col(c).list.eval(pl.element().struct.field("content")).list.join("\n",
                                                                                 ignore_nulls=True)
             for c in cols]
    return pl.concat_str(parts, separator="\n", ignore_nulls=True)


def _content_chars(cols: list[str]) -> pl.Expr:
    return pl.sum_horizontal(
        pl.col(c).list.eval(pl.element().struct.field("content").str.len_chars()).list.sum()
        for c in cols)


# Punctuation and whitespace become spaces (Aho-Corasick in one pass: a regex over every word
# gap was the slowest step of the card).
_SEPARATORS = list("\n\t\r.,;:!?\"'()[]{}<>/\\|-_*#@&%$+=~`^") + ["\u2019", "\u201c", "\u201d"]


def _normalized(expr: pl.Expr) -> pl.Expr:
    """Lower-case words separated by spaces (runs of separators may leave double spaces)."""
    return expr.str.to_lowercase().str.replace_many(_SEPARATORS, [" "] * len(_SEPARATORS))


def _key(expr: pl.Expr) -> pl.Expr:
    """What "equal after normalisation" compares: the lower-case words without any separators
    (the same as _normalized with its spaces taken out, in one pass)."""
    return expr.str.to_lowercase().str.replace_many(_KEY_DROP, [""] * len(_KEY_DROP))


_KEY_DROP = [*_SEPARATORS, " "]
_ASCII_DROP = "".join(c for c in _KEY_DROP if c.isascii()).encode()
_WIDE_DROP = [c for c in _KEY_DROP if not c.isascii()]


def _pair_text(kind: Kind) -> pl.Expr:
    """What makes a pair itself, for near-duplicates: the end of the last prompt turn and the
    start of each answer. A long shared context (a meeting excerpt before different questions)
    must not make different pairs look alike."""
    def content(col: str, i: int) -> pl.Expr:
        return pl.col(col).list.get(i, null_on_oob=True).struct.field("content").fill_null("")

    if kind == "sft":
        question, answers = content("messages", -2), [content("messages", -1)]
    else:
        question = content("prompt", -1)
        answers = [pl.col(c).list.eval(pl.element().struct.field("content")).list.join(" ")
                   for c in ("chosen", "rejected")]
    return pl.concat_str([question.str.slice(-QUESTION_TAIL),
                          *(a.str.slice(0, ANSWER_HEAD) for a in answers)], separator=" ")


def _empty_turn(cols: list[str]) -> pl.Expr:
    return pl.any_horizontal(
        pl.col(c).list.eval(pl.element().struct.field("content").fill_null("")
                            .str.strip_chars().str.len_chars() == 0).list.any()
        for c in cols)


_MASKS = [random.Random(1234 + i).getrandbits(64) for i in range(8)]
BANDS, ROWS_PER_BAND = 4, 2  # 8 minhashes: candidate pairs from bands, verified exactly
QUESTION_TAIL, ANSWER_HEAD = 300, 600  # characters of a pair that near-duplicates compare


def near_duplicates(rows: pl.DataFrame, threshold: float) -> pl.Series:
    """Rows (`id`, `norm`) whose MinHash signature agrees with an earlier row's on ≥ threshold
    of 8 hashes — an estimate of the Jaccard similarity of their word bigrams — and whose exact
    Jaccard then reaches the threshold. `norm` is the pair's identity (see _pair_text). LSH
    bands find the candidates, so the work stays linear in rows."""
    sig = signatures(rows["norm"]).with_columns(rows["id"])
    return _near_from_signatures(sig, lambda ids: rows.filter(pl.col("id").is_in(ids.implode()))
                                 .select("id", "norm"), threshold)


def signatures(norm: pl.Series, chunk: int = 8192) -> pl.DataFrame:
    """The 8 MinHashes (s0…s7) of each text's word bigrams. Each word's hash is mixed with the
    next one's (the last word stands alone); an empty text gets zeros. Words are split and
    hashed by Polars over a flat column, the minima taken per row by NumPy: a list.eval per
    row was the slowest step of the card."""
    n = len(norm)
    out = np.zeros((n, len(_MASKS)), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for start in range(0, n, chunk):
            lists = norm.slice(start, chunk).str.split(" ")
            m = len(lists)
            lens = lists.list.len().fill_null(1).to_numpy()  # a null explodes to one null
            words = lists.explode()
            keep = (words.str.len_bytes().fill_null(0) > 0).to_numpy()
            h = words.hash(seed=7).to_numpy()[keep]
            if not len(h):
                continue
            row = np.repeat(np.arange(m), lens)[keep]
            nxt = np.zeros_like(h)
            nxt[:-1] = np.where(row[1:] == row[:-1], h[1:], 0)
            big = h ^ (nxt * _GOLDEN)
            cnt = np.bincount(row, minlength=m)
            has = np.flatnonzero(cnt)
            seg = (np.cumsum(cnt) - cnt)[has]
            tmp = np.empty_like(big)
            for i, mask in enumerate(_MASKS):
                np.bitwise_xor(big, np.uint64(mask), out=tmp)
                out[start + has, i] = np.minimum.reduceat(tmp, seg)
    return pl.DataFrame({f"s{i}": out[:, i] for i in range(len(_MASKS))},
                        schema={f"s{i}": pl.UInt64 for i in range(len(_MASKS))})


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _near_from_signatures(sig: pl.DataFrame, texts: Callable[[pl.Series], pl.DataFrame],
                          threshold: float) -> pl.Series:
    """Near duplicates among the rows of `sig` (`id`, s0…s7, ascending ids): banded candidates,
    shortlisted by their signatures' agreement, decided by the exact Jaccard of the texts
    (`id`, `norm`) that `texts(ids)` gives."""
    if sig.height < 2:
        return pl.Series("id", [], dtype=pl.UInt32)
    ids = sig["id"].to_numpy().astype(np.int64)
    s = sig.select(f"s{i}" for i in range(len(_MASKS))).to_numpy()
    # Candidates: each row against its band-bucket's first row and its predecessor there
    # (a shared common phrase can put unrelated rows in one bucket: the first alone would
    # hide the real partner). A stable sort by band key keeps each bucket in id order.
    pairs = []
    with np.errstate(over="ignore"):
        for b in range(BANDS):
            key = s[:, b * ROWS_PER_BAND].copy()
            for r in range(1, ROWS_PER_BAND):
                key = key * _GOLDEN ^ s[:, b * ROWS_PER_BAND + r]
            order = np.argsort(key, kind="stable")
            k = key[order]
            same = np.empty(len(k), dtype=bool)
            same[0] = False
            same[1:] = k[1:] == k[:-1]
            first = np.maximum.accumulate(np.where(same, 0, np.arange(len(k))))
            at = np.flatnonzero(same)
            row = order[at] << 32
            pairs += [row | order[first[at]], row | order[at - 1]]
    both = _distinct(np.concatenate(pairs))
    cand = np.stack([both >> 32, both & 0xFFFFFFFF], 1)  # positions: (row, earlier row)
    if not len(cand):
        return pl.Series("id", [], dtype=pl.UInt32)
    # The 8-hash estimate is noisy: it only shortlists; the exact Jaccard decides.
    agree = (s[cand[:, 0]] == s[cand[:, 1]]).sum(axis=1) / len(_MASKS)
    cand = cand[agree >= threshold - 0.35]
    text = texts(pl.Series("id", ids[_distinct(cand.ravel())], dtype=pl.UInt32))
    near = ids[cand[:, 0]][jaccards(text, ids[cand[:, 0]], ids[cand[:, 1]]) >= threshold]
    return pl.Series("id", _distinct(near), dtype=pl.UInt32)


def jaccards(text: pl.DataFrame, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The exact Jaccard similarity of the word-bigram sets (see _shingles) of the texts
    (`id`, `norm`) of rows a[k] and b[k], for every k."""
    norm = dict(text.iter_rows())
    return np.array([_jaccard(norm[i], norm[j]) for i, j in zip(a.tolist(), b.tolist(), strict=True)],
                    dtype=np.float64)


def _distinct(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique's hashing path is many times slower here)."""
    a = np.sort(a)
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if len(a) else a


def _shingles(norm: str) -> set[Any]:
    """Word bigrams (as pairs of words), or the words of a text of fewer than two."""
    words = norm.split()  # as the Polars side: no empty words
    return set(zip(words, words[1:], strict=False)) or set(words)


def _jaccard(a: str, b: str) -> float:
    sa, sb = _shingles(a), _shingles(b)
    common = len(sa & sb)
    union = len(sa) + len(sb) - common
    return common / union if union else 1.0


def score_bucket(root: Path, bucket: str, kind: Kind, cfg: ScorecardConfig
                 ) -> tuple[BucketScore, pl.DataFrame]:
    """Score one bucket; returns its card and the clean rows (with a stable `split`).

    Files are read and put through the per-row rules one at a time; only the rows' ids,
    statuses, hashes and MinHash signatures (and the message columns the clean rows are
    returned with) are kept for the bucket-wide duplicate passes."""
    path = root / bucket
    cols = ["messages"] if kind == "sft" else ["prompt", "chosen", "rejected"]

    def rules(file: Path) -> tuple[pl.DataFrame, pl.DataFrame, int]:
        frame, n = read_file(path, file, kind)
        return *_row_rules(frame.with_row_index("id"), kind, cols, cfg), n

    # Two files at a time: much of a file's work is single-threaded (NumPy, the stable hash),
    # and Polars and NumPy let go of the GIL.
    parts, sigs, raw_lines, offset = [], [], 0, 0
    with ThreadPoolExecutor(FILE_WORKERS) as pool:
        for part, sig, n in pool.map(rules, bucket_files(path)):
            raw_lines += n
            parts.append(part.with_columns(pl.col("id") + offset))
            sigs.append(sig.with_columns(pl.col("id") + offset))
            offset += part.height
    if not parts:
        part, sig = _row_rules(empty_bucket(kind).with_row_index("id"), kind, cols, cfg)
        parts, sigs = [part], [sig]
    df, sig = pl.concat(parts), pl.concat(sigs)
    del parts, sigs
    first = pl.col("id").min().over("h")
    df = df.with_columns(status=pl.when(pl.col("status").is_null() & (pl.col("id") != first))
                         .then(pl.lit("exact_duplicate")).otherwise(pl.col("status"))).drop("h")
    ok = pl.col("status").is_null()
    sig = sig.filter(pl.col("id").is_in(df.filter(ok)["id"].implode()))
    near = _near_from_signatures(sig, lambda ids: df.filter(pl.col("id").is_in(ids.implode()))
                                 .select("id", norm=_normalized(_pair_text(kind))),
                                 cfg.near_duplicate_threshold)
    df = df.with_columns(status=pl.when(ok & pl.col("id").is_in(near.implode()))
                         .then(pl.lit("near_duplicate")).otherwise(pl.col("status")))
    card = _compose(bucket, kind, path, df, cfg, raw_lines)
    clean = df.filter(pl.col("status").is_null())
    split = (pl.col("stable") % 10_000 < int(cfg.eval_share * 10_000))
    clean = clean.with_columns(split=pl.when(split).then(pl.lit("eval")).otherwise(pl.lit("train")))
    return card, clean.select("source", *cols, "split", "file", "line")


def _row_rules(df: pl.DataFrame, kind: Kind, cols: list[str], cfg: ScorecardConfig
               ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The per-row rules (through secrets_pii) over one file's rows: the rows with their status,
    `pii`, the in-run duplicate hash `h` and the `stable` hash; and the MinHash signatures of
    the rows still clean, for the near-duplicate pass."""
    # One lazy pass: the full text feeds the PII check and the duplicate key, then goes.
    pii = pl.col("text").str.contains("|".join(f"(?:{p})" for p in PII_PATTERNS.values()))
    df = (df.lazy().with_columns(text=_text(cols))
          .with_columns(pii=pii, low=pl.col("text").str.to_lowercase()
                        .str.replace_many(_WIDE_DROP, [""] * len(_WIDE_DROP)),
                        tokens=_content_chars(cols) / CHARS_PER_TOKEN)
          .drop("text").collect())
    ok = pl.col("status").is_null()
    df = df.with_columns(
        pii=pl.when(ok).then(pl.col("pii")).otherwise(False),
        status=pl.when(~ok).then(pl.col("status"))
        .when(_empty_turn(cols)).then(pl.lit("empty_turn"))
        .when(pl.col("tokens") < cfg.min_tokens).then(pl.lit("too_short"))
        .when(pl.col("tokens") > cfg.max_tokens).then(pl.lit("too_long"))
        .when(_ties(df, kind)).then(pl.lit("chosen_equals_rejected"))
        .otherwise(None))
    if cfg.pii_policy == "drop":
        df = df.with_columns(status=pl.when(pl.col("status").is_null() & pl.col("pii"))
                             .then(pl.lit("secrets_pii")).otherwise(pl.col("status")))
    # The key's hash `h` finds duplicates; as `stable` (it never changes across library
    # versions) it also makes the split and the digest.
    h = pl.Series("h", _key_hashes(df["low"]), dtype=pl.UInt64)
    df = df.with_columns(h=pl.when(pl.col("low").is_not_null()).then(h)).drop("low") \
        .with_columns(stable=pl.when(ok).then(pl.col("h")))
    clean = df.filter(ok)
    sig = signatures(clean.select(norm=_normalized(_pair_text(kind)))["norm"]) \
        .with_columns(clean["id"])
    return df.select("id", "file", "line", "source", "status", "pii", "h", "stable", *cols), sig


def _ties(df: pl.DataFrame, kind: Kind) -> pl.Expr:
    """Rows whose chosen and rejected answers are equal after normalisation. Only rows whose
    answers' starts agree are compared whole: the key of a prefix is a prefix of the key
    (the last lower-cased character aside: a final sigma depends on what follows)."""
    if kind != "dpo":
        return pl.lit(False)
    c, r = _text(["chosen"]), _text(["rejected"])

    def start(e: pl.Expr) -> pl.Expr:
        return _key(e.str.slice(0, 64).str.to_lowercase().str.head(-1))

    ids = df.with_columns(_c=start(c), _r=start(r)) \
        .filter(pl.col("_c").str.starts_with(pl.col("_r")) | pl.col("_r").str.starts_with(pl.col("_c"))) \
        .filter(_key(c) == _key(r))["id"]
    return pl.col("id").is_in(ids.implode())


def _key_hashes(low: pl.Series) -> np.ndarray:
    """blake2b-64 (little-endian) of the UTF-8 bytes of each text's key (see _key), from the
    lower-cased text with its non-ASCII separators gone: deleting the ASCII ones byte-wise is
    many times faster than in Polars, and in UTF-8 an ASCII byte is always its own character."""
    blake = hashlib.blake2b
    return np.frombuffer(b"".join([
        blake((v or b"").translate(None, _ASCII_DROP), digest_size=8).digest()
        for v in low.cast(pl.Binary).to_list()]), dtype="<u8").astype(np.uint64)


def _compose(bucket: str, kind: Kind, path: Path, df: pl.DataFrame, cfg: ScorecardConfig,
             raw_lines: int) -> BucketScore:
    """The bucket's card from its rows and their statuses (None: clean)."""
    counts: dict[str | None, int] = dict(df.group_by("status").len().iter_rows())
    stable = df.select(pl.col("stable").filter(pl.col("status").is_null()))["stable"]
    total, n_clean = df.height, stable.len()
    by_source = df.group_by("source").agg(total=pl.len(),
                                          clean=pl.col("status").is_null().sum()) \
        .sort(["clean", "source"], descending=[True, False])
    sources = [SourceShare(source=s, total=t, clean=c,
                           share_of_clean=round(c / n_clean, 4) if n_clean else 0.0)
               for s, t, c in by_source.iter_rows()]
    reasons = []
    if n_clean < cfg.floor:
        reasons.append(f"{n_clean} clean pairs < floor {cfg.floor}")
    distinct = sum(1 for s in sources if s.clean)
    if distinct < cfg.min_sources:
        reasons.append(f"{distinct} distinct sources < minimum {cfg.min_sources}")
    for s in sources:
        if n_clean and s.share_of_clean > cfg.max_source_share:
            reasons.append(f"source '{s.source}' is {s.share_of_clean:.0%} of clean "
                           f"pairs > cap {cfg.max_source_share:.0%}")
    digest = sha256_hex(stable.sort().to_numpy().astype("<u8").tobytes())
    return BucketScore(
        bucket=bucket, kind=kind, path=str(path.resolve()), raw_lines=raw_lines, total=total,
        clean=n_clean, passed=not reasons, reasons=reasons,
        rules={r: int(counts.get(r, 0)) for r in RULES},
        pii_flagged=int(df["pii"].sum()) if cfg.pii_policy == "flag" else 0,
        sources=sources, digest=digest)


def scorecard_of(cards: list[BucketScore], cfg: ScorecardConfig, corpus: Path) -> Scorecard:
    """The card of a corpus: its buckets' scores under these bounds."""
    return Scorecard(version=SCORECARD_VERSION, corpus=str(corpus.resolve()), floor=cfg.floor,
                     config=cfg.rules_only().model_dump(), buckets=cards)
