"""Reading the training corpus into one canonical Polars frame per bucket.

Every row becomes conversational lists of {role, content} messages:
  SFT (`engineering`):     messages            ← {"messages": [...]} or {"prompt", "completion"}
  DPO (`apprenticeship`):  prompt, chosen, rejected ← strings or message lists, or the
                           implicit-prompt form {"chosen", "rejected"} (HH-RLHF dialogues)
Rows that cannot be read keep their place with a `status` saying why (invalid UTF-8,
unparseable, wrong schema), so the scorecard counts every line.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import polars as pl

from tasks.shared.errors import ConfigError

Kind = Literal["sft", "dpo"]
MESSAGE = pl.Struct({"role": pl.String, "content": pl.String})
MESSAGES = pl.List(MESSAGE)
DIALOGUE_TURN = re.compile(r"\n\n(Human|Assistant):[ ]?")
ROLE = {"Human": "user", "Assistant": "assistant"}


def bucket_files(root: Path) -> list[Path]:
    if not root.is_dir():
        raise ConfigError(f"corpus bucket folder {root.resolve()} does not exist — create it, "
                          "or fix the corpus root / bucket name")
    files = {p for pat in ("*.jsonl", "*.jsonl.gz") for p in root.rglob(pat) if p.is_file()}
    return sorted(files)


def default_source(root: Path, path: Path) -> str:
    """The sub-folder of origin, or the file name when the file sits at the bucket's top."""
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else rel.name.removesuffix(".gz")


def _read_lines(path: Path) -> tuple[pl.DataFrame, int]:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    try:
        lines = data.decode("utf-8").split("\n")
        utf8: pl.Expr | list[bool] = pl.lit(True)
    except UnicodeDecodeError:
        lines, utf8 = [], []
        for raw in data.split(b"\n"):
            try:
                lines.append(raw.decode("utf-8"))
                utf8.append(True)
            except UnicodeDecodeError:
                lines.append("")
                utf8.append(False)
    df = pl.Series("raw", lines, dtype=pl.String).to_frame().with_row_index("line", 1) \
        .with_columns(utf8=utf8 if isinstance(utf8, pl.Expr) else pl.Series(utf8, dtype=pl.Boolean))
    # Blank lines are layout, not rows (they still count as raw lines, for information).
    return df.filter(~(pl.col("utf8") & pl.col("raw").str.contains(r"^\s*$"))), \
        len(lines) - (1 if lines and lines[-1] == "" else 0)


def _field(name: str) -> pl.Expr:
    return pl.col("raw").str.json_path_match(f"$.{name}")


def _is_str(name: str) -> pl.Expr:
    return pl.col("raw").str.contains(rf'"{name}"\s*:\s*"')


def _is_list(name: str) -> pl.Expr:
    return pl.col("raw").str.contains(rf'"{name}"\s*:\s*\[')


def _as_messages(name: str, role: str, content: pl.Expr) -> pl.Expr:
    """A string field (its value: `content`) becomes one message with `role`; a list is
    decoded as messages (_decode_lists)."""
    one = pl.concat_list(pl.struct(role=pl.lit(role), content=content))
    return pl.when(_is_str(name)).then(one).otherwise(None).alias(name)


def _decode_lists(df: pl.DataFrame, names: list[str]) -> pl.DataFrame:
    """Decode list-typed fields; rows whose lists are not messages get status wrong_schema."""
    for name in names:
        listed = df.select(pl.when(_is_list(name)).then(_field(name)).alias("j"))["j"]
        try:
            decoded = listed.str.json_decode(dtype=MESSAGES)
        except pl.exceptions.PolarsError:
            decoded = pl.Series([_py_messages(v) for v in listed.to_list()], dtype=MESSAGES)
            bad = listed.is_not_null() & decoded.is_null()
            df = df.with_columns(status=pl.when(bad & pl.col("status").is_null())
                                 .then(pl.lit("wrong_schema")).otherwise(pl.col("status")))
        df = df.with_columns(decoded.alias("_decoded")) \
            .with_columns(pl.coalesce("_decoded", name).alias(name)).drop("_decoded")
    return df


def _py_messages(value: str | None) -> list[dict[str, str | None]] | None:
    if value is None:
        return None
    try:
        items = json.loads(value)
    except ValueError:
        return None
    if not all(isinstance(m, dict) and isinstance(m.get("content"), str | None) for m in items):
        return None
    return [{"role": str(m.get("role") or ""), "content": m.get("content")} for m in items]


def split_dialogue(text: str) -> list[dict[str, str]]:
    """'\\n\\nHuman: a\\n\\nAssistant: b' → [{user, a}, {assistant, b}]."""
    parts = DIALOGUE_TURN.split(text)
    return [{"role": ROLE[parts[i]], "content": parts[i + 1].strip()}
            for i in range(1, len(parts) - 1, 2)]


def split_implicit(chosen: list[dict[str, Any]], rejected: list[dict[str, Any]]
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Shared leading turns are the prompt; the rest, from the first divergent turn, are the
    chosen and rejected completions."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if n == len(chosen) == len(rejected) and n:  # identical dialogues: a tie, last turn apart
        n -= 1
    return chosen[:n], chosen[n:], rejected[n:]


def _implicit_rows(df: pl.DataFrame) -> pl.DataFrame:
    """HH-RLHF form: no prompt; chosen and rejected are whole dialogues (text or messages)."""
    out: dict[str, list[Any]] = {"prompt": [], "chosen": [], "rejected": []}
    for raw in df["raw"].to_list():
        row = json.loads(raw)
        c, r = row["chosen"], row["rejected"]
        cm = split_dialogue(c) if isinstance(c, str) else _py_messages(json.dumps(c)) or []
        rm = split_dialogue(r) if isinstance(r, str) else _py_messages(json.dumps(r)) or []
        p, cc, rr = split_implicit(cm, rm)
        out["prompt"].append(p or None)
        out["chosen"].append(cc or None)
        out["rejected"].append(rr or None)
    return df.with_columns(
        pl.Series("prompt", out["prompt"], dtype=MESSAGES),
        pl.Series("chosen", out["chosen"], dtype=MESSAGES),
        pl.Series("rejected", out["rejected"], dtype=MESSAGES),
    )


def empty_bucket(kind: Kind) -> pl.DataFrame:
    cols = ["messages"] if kind == "sft" else ["prompt", "chosen", "rejected"]
    return pl.DataFrame(schema={"file": pl.String, "line": pl.UInt32, "source": pl.String,
                                "status": pl.String, "raw_chars": pl.UInt32,
                                **{c: MESSAGES for c in cols}})


def read_file(root: Path, path: Path, kind: Kind) -> tuple[pl.DataFrame, int]:
    """One file's rows (see read_bucket) and its raw line count."""
    cols = ["messages"] if kind == "sft" else ["prompt", "chosen", "rejected"]
    lines, n = _read_lines(path)
    return _parse(lines.with_columns(file=pl.lit(str(path.relative_to(root))),
                                     default_source=pl.lit(default_source(root, path))),
                  kind, cols), n


def iter_bucket(root: Path, kind: Kind) -> Iterator[tuple[pl.DataFrame, int]]:
    """The rows of a bucket one file at a time (see read_bucket), with each file's raw line
    count, so a caller can reduce a file before the next one is parsed."""
    for path in bucket_files(root):
        yield read_file(root, path, kind)


def read_bucket(root: Path, kind: Kind) -> tuple[pl.DataFrame, int]:
    """All rows of a bucket — file, line, source, status (null = readable), raw_chars and the
    canonical message columns of its kind — and the raw line count (information only).
    Files are parsed one at a time, so raw lines never pile up in memory."""
    frames, raw_lines = [], 0
    for frame, n in iter_bucket(root, kind):
        frames.append(frame)
        raw_lines += n
    return (pl.concat(frames), raw_lines) if frames else (empty_bucket(kind), 0)


def _decoded(df: pl.DataFrame, fields: dict[str, pl.DataType]) -> pl.DataFrame | None:
    """The top-level `fields` of every readable row in one JSON decode (other rows: nulls), as
    columns `_f_<name>`; None when some row's value does not fit its type (a list where a string
    was expected, say): then each field is matched on its own, row by row."""
    raw = pl.when(pl.col("status").is_null()).then(pl.col("raw")).otherwise(pl.lit("{}"))
    try:
        dec = df.select(raw.str.json_decode(dtype=pl.Struct(fields)).alias("_d"))
    except pl.exceptions.PolarsError:
        return None
    return dec.select(pl.col("_d").struct.field(n).alias(f"_f_{n}") for n in fields)


def _unparseable(rows: pl.Expr) -> pl.Expr:
    """Status `unparseable` for the still-readable `rows` that are not a JSON object."""
    bad = pl.col("status").is_null() & rows & pl.col("raw").str.json_path_match("$").is_null()
    return pl.when(bad).then(pl.lit("unparseable")).otherwise(pl.col("status")).alias("status")


def _parse(df: pl.DataFrame, kind: Kind, cols: list[str]) -> pl.DataFrame:
    # A JSON object starts with "{" and ends with "}" (JSON whitespace aside): a truncated line
    # is unparseable without a parse.
    obj = pl.col("raw").str.strip_chars_start().str.starts_with("{") & \
        pl.col("raw").str.strip_chars_end().str.ends_with("}")
    df = df.with_columns(
        status=pl.when(~pl.col("utf8")).then(pl.lit("invalid_utf8"))
        .when(~obj).then(pl.lit("unparseable")).otherwise(None),
        raw_chars=pl.col("raw").str.len_chars().cast(pl.UInt32))
    strings = ["source", *(["prompt", "completion"] if kind == "sft" else cols)]
    fields: dict[str, pl.DataType] = {n: pl.String() for n in strings}
    if kind == "sft":
        fields["messages"] = MESSAGES
    # One decode of every line that may be an object proves them all JSON at once; when one is
    # not (or a field's type does not fit), each line is parsed on its own.
    dec = _decoded(df, fields)
    if dec is None:
        df = df.with_columns(_unparseable(pl.lit(True)))
        dec = _decoded(df, fields)
    else:  # the decoder lets a lone surrogate escape through, the JSON parser does not
        odd = pl.col("raw").str.contains(r"\\u[dD][89a-fA-F]")
        if df.select((odd & pl.col("status").is_null()).any()).item():
            df = df.with_columns(_unparseable(odd))
            dec = _decoded(df, fields)
    if dec is not None:
        df = pl.concat([df, dec], how="horizontal")

    def field(name: str) -> pl.Expr:
        return pl.col(f"_f_{name}") if dec is not None else _field(name)

    df = df.with_columns(source=pl.when(_is_str("source")).then(field("source"))
                         .otherwise(pl.col("default_source")))
    if kind == "sft":
        df = df.with_columns(
            messages=pl.when(_is_list("messages")).then(field("messages") if dec is not None else None)
            .when(_is_str("prompt") & _is_str("completion"))
            .then(pl.concat_list(pl.struct(role=pl.lit("user"), content=field("prompt")),
                                 pl.struct(role=pl.lit("assistant"),
                                           content=field("completion"))))
            .otherwise(None))
        if dec is None:
            df = _decode_lists(df, ["messages"])
    else:
        implicit = ~pl.col("raw").str.contains(r'"prompt"\s*:') & \
            (_is_str("chosen") | _is_list("chosen")) & (_is_str("rejected") | _is_list("rejected"))
        df = df.with_columns(implicit=implicit & pl.col("status").is_null(),
                             **{c: _as_messages(c, "user" if c == "prompt" else "assistant",
                                                field(c)) for c in cols})
        if dec is None:  # a decode that fit every row had no lists among these fields
            df = _decode_lists(df, cols)
        imp = df.filter(pl.col("implicit"))
        if imp.height:
            df = pl.concat([df.filter(~pl.col("implicit")), _implicit_rows(imp)]).sort("line")
    complete = pl.all_horizontal(pl.col(c).is_not_null() & (pl.col(c).list.len() > 0)
                                 for c in cols)
    df = df.with_columns(status=pl.when(pl.col("status").is_null() & ~complete)
                         .then(pl.lit("wrong_schema")).otherwise(pl.col("status")))
    return df.select("file", "line", "source", "status", "raw_chars", *cols)
