"""The mutation score of `make mutation`: killed / total per module, over the mutants whose
names match the patterns given (the same ones `mutmut run` was given), from `mutmut results`.

    python tests/unit/mutation_score.py [--min 80] PATTERN...

Survivors are listed by name (`mutmut show NAME` prints the change). A timeout counts as
killed (the mutant hung the test: it was noticed); "not checked" or "no tests" as survived.
Equivalent mutants (EQUIVALENT below, each with the reason) are left out of the total.
Exit 1 when the total score is below --min percent."""

from __future__ import annotations

import argparse
import fnmatch
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

KILLED = {"killed", "timeout", "caught by type check"}

# Equivalent mutants: the changed line (as `mutmut show` prints it, stripped) cannot change what
# the function returns or does, so no test can kill it. Matched by the mutant's function and
# its new line, not by its number (numbers move when the code does).
# A flag or placeholder only ever read as a condition, set to another false value.
AS_CONDITION = "only read as a condition: None, '' and False are all false"

EQUIVALENT: dict[tuple[str, str], str] = {
    ("tasks.extraction.plan.x_plan", "out = Plan([], [], [], None)"):
        "`deleted` is always assigned before plan() returns",
    ("tasks.extraction.resolve.x__split_trailing_paren",
     "for i in range(len(s) - 1, -2, -1):"):
        "the extra step reads s[-1], the closing parenthesis, after the scan found no match: "
        "(s, None) either way",
    ("tasks.extraction.resolve.x__strip_honorifics", "changed = None"):
        "None and False are both false",
    ("tasks.extraction.resolve.x__strip_postnominals", "parts = s.split(None)"):
        "split_name has already collapsed whitespace to single spaces",
    ("tasks.extraction.resolve.x__strip_postnominals",
     'parts[-1].replace("XX.XX", "").isupper():'):
        "dots are uncased: isupper() gives the same answer with or without them",
    ("tasks.extraction.resolve.x__strip_postnominals",
     'parts[-1].replace(".", "XXXX").isupper():'):
        "dots are uncased: isupper() gives the same answer with or without them",
    ("tasks.corpus.scorecard.x_jaccards", "dtype=None)"):
        "an array of Python floats is float64 anyway (and so is an empty one)",
    ("tasks.corpus.scorecard.x_jaccards", ")"):
        "an array of Python floats is float64 anyway (and so is an empty one)",
    **{("tasks.corpus.scorecard.x_jaccards",
        "return np.array([_jaccard(norm[i], norm[j]) for i, j in zip(a.tolist(), b.tolist(), "
        f"{strict})],"): "a and b are the two columns of one pair array: always equally long"
       for strict in ("strict=None", "", "strict=False")},
    **{("tasks.corpus.scorecard.x__shingles",
        f"return set(zip(words, words[1:], {strict})) or set(words)"):
       "strict=False is zip's default" for strict in ("strict=None", "")},
    # _ties compares whole keys only where the keys of the answers' starts are prefixes of
    # each other. Any start whose key is a prefix of the whole key is sound (for a tie both are
    # prefixes of one key): these change how much is filtered out first, not the result.
    **{("tasks.corpus.scorecard.x__ties", f"return _key(e.str.slice({a}).str.to_lowercase()"
                                          f".str.head({b}))"):
       "a start of another length is still a prefix of the whole key: fewer rows filtered "
       "out first, the same ties" for a, b in [("0, None", "-1"), ("0, ", "-1"), ("0, 65", "-1"),
                                               ("0, 64", "+1"), ("0, 64", "-2")]},
    ("tasks.corpus.scorecard.x__row_rules",
     'pii=pl.when(ok).then(pl.col("pii")).otherwise(None),'):
        "the card sums `pii`, and a sum skips nulls as it skips False",
    **{("tasks.corpus.scorecard.x__row_rules", f'h = pl.Series({args}'):
       "the series is only a value in with_columns(h=…), which names it; _key_hashes gives "
       "uint64 already" for args in (
           'None, _key_hashes(df["low"]), dtype=pl.UInt64)',
           '"h", _key_hashes(df["low"]), dtype=None)',
           '_key_hashes(df["low"]), dtype=pl.UInt64)',
           '"h", _key_hashes(df["low"]), )',
           '"XXhXX", _key_hashes(df["low"]), dtype=pl.UInt64)',
           '"H", _key_hashes(df["low"]), dtype=pl.UInt64)')},
    # The last part of rsplit("/") is the same whatever the split count; rsplit("/", 1) of a
    # value with a "/" has two parts, so [1] is [-1]: the tokenizer and model_path are absolute
    # (blocks/node_serve.py checks), base_repo is org/name (image_build checks), base_image a URL.
    **{("tasks.gcp.image.xǁImageBuildǁscript", line):
       "the same last path part (see the comment above)" for line in (
           'tokenizer_name=q(self.tokenizer.rstrip("/").rsplit("/", )[-1]),',
           'tokenizer_name=q(self.tokenizer.rstrip("/").rsplit("/", 2)[-1]),',
           'tokenizer_name=q(self.tokenizer.rstrip("/").rsplit("/", 1)[+1]),',
           'base_name=q(base_repo.rsplit("/", )[-1]),',
           'base_name=q(base_repo.split("/", 1)[-1]),',
           'base_name=q(base_repo.rsplit("/", 2)[-1]),',
           'base_name=q(base_repo.rsplit("/", 1)[+1]),',
           'base_gguf_name=q(self.base_gguf.rsplit("/", )[-1]),',
           'base_gguf_name=q(self.base_gguf.rsplit("/", 2)[-1]),',
           'model_name=q(self.model_path.rsplit("/", )[-1]), quant=self.quant,',
           'model_name=q(self.model_path.rsplit("/", 2)[-1]), quant=self.quant,',
           'model_name=q(self.model_path.rsplit("/", 1)[+1]), quant=self.quant,')},
    **{("tasks.gcp.image.xǁImageBuildǁplan",
        f"f\"{{self.base_image.rsplit('/', {k})[{i}]}}, boot disk {{IMAGE_GB}} GB pd-balanced "
        "(the image; \""): "the same last path part of a URL" for k, i in (
           ("", "-1"), ("2", "-1"), ("1", "+1"))},
    # The band key only has to put rows equal on a band in one bucket; other rows that share
    # one by accident are shortlisted and decided by the exact Jaccard: the same result.
    **{("tasks.corpus.scorecard.x__near_from_signatures", line): why for line, why in (
        ("for r in range(ROWS_PER_BAND):",
         "the key is still a function of the band's two hashes (see the comment above)"),
        ("key = key * _GOLDEN & s[:, b * ROWS_PER_BAND + r]",
         "rows equal on the band still share the key; more accidental candidates, decided by "
         "the exact Jaccard (see the comment above)"),
        ('order = np.argsort(key, kind="STABLE")',
         "NumPy reads a sort kind by its first letter, in either case"),
        ("ids = sig[\"id\"].to_numpy().astype(None)",
         "the ids are UInt32: float64 holds each exactly and the result is cast back"),
        ("with np.errstate(over=None):",
         "NumPy does not check integer overflow in array arithmetic: the errstate changes "
         "nothing here"),
        ("same = np.empty(len(k), dtype=None)", "0.0 and 1.0 select as False and True do"),
        ("same = np.empty(len(k), )", "0.0 and 1.0 select as False and True do"),
        ("same[0] = None", "None stored in a boolean array is False"))},
    # Keys are Type:name and normalize() turns every ':' of a name into a space: one ':' a key.
    **{("tasks.extraction.answers.x__from_llm",
        f"s_type, d_type = {a}, {b}"): "a key holds one ':' (see the comment above)"
       for a, b in (('src.split(":", )[0]', 'dst.split(":", 1)[0]'),
                    ('src.rsplit(":", 1)[0]', 'dst.split(":", 1)[0]'),
                    ('src.split(":", 2)[0]', 'dst.split(":", 1)[0]'),
                    ('src.split(":", 1)[0]', 'dst.split(":", )[0]'),
                    ('src.split(":", 1)[0]', 'dst.rsplit(":", 1)[0]'),
                    ('src.split(":", 1)[0]', 'dst.split(":", 2)[0]'))},
    **{("tasks.evaluation.metrics.x_score_case", line):
       "the union over nothing is set(), the else branch's value" for line in (
           "mine = set().union(*(forms(n) for n in p.names)) if (p.names) or True else set()",
           "found_agnostic = set().union(*agnostic.values()) if (agnostic) or True else set()",
           "found_strict = set().union(*strict.values()) if (strict) or True else set()")},
    ("tasks.evaluation.metrics.x_score",
     'scores = [score_case(case, preds.get(case.id) or CasePrediction(None, error="no answer",'):
        "score_case never reads the placeholder prediction's case_id (the score takes case.id)",
    # _SchemaFile holds only str, bool and tuples of them: a python-mode dump (any mode but
    # "json") gives json.dumps the same values.
    **{("tasks.graph.ontology.x__canonical", f"data = spec.model_dump(mode={mode})"):
       "the same JSON (see the comment above)" for mode in ("None", '"XXjsonXX"', '"JSON"')},
    ("tasks.graph.ontology.x__canonical",
     "return json.dumps(data, sort_keys=True, ensure_ascii=None)"):
        "json.dumps's ensure_ascii is " + AS_CONDITION,
    # load_schema's key for a file it cannot stat: that read raises and is not cached, and a
    # negative or tiny size never meets a valid schema file's key.
    ("tasks.graph.ontology.x_load_schema", 'st = ""'):
        "st is " + AS_CONDITION,
    **{("tasks.graph.ontology.x_load_schema", line): "the key of a file that cannot be read "
       "(see the comment above)" for line in (
           "return _load(p, st.st_mtime_ns if st else 1, st.st_size if st else -1)",
           "return _load(p, st.st_mtime_ns if st else 0, st.st_size if st else +1)",
           "return _load(p, st.st_mtime_ns if st else 0, st.st_size if st else -2)")},
    ("tasks.engine.llama_build.x__record_line",
     'digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"XX=XX").decode()'):
        "a sha256 in base64 is 43 characters and one '=': the 43rd holds 4 bits and 2 zero bits, "
        "so it is never 'X'",
    ("tasks.engine.llama_build.x_add_to_wheel",
     "info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 1))"):
        "zip stores time in 2-second steps: 00:00:01 is written as 00:00:00",
    # packaging 26: contains() with prereleases None (its default) admits a prerelease unless
    # the set was made with prereleases=False, which a Requirement read from pyproject never is
    **{("tasks.shared.environment.x_differences", line): "prereleases None is True here (see "
       "the comment above)" for line in (
           "fits = req.specifier.contains(Version(got), prereleases=None)",
           "fits = req.specifier.contains(Version(got), )")},
    ("tasks.shared.environment.x_differences", "fits = None"):
        "fits is " + AS_CONDITION,
    ("tasks.extraction.pacing.x_quantile",
     "return s[min(len(s) + 1, max(0, math.ceil(q * len(s)) - 1))]"):
        "every caller's q is at most 1 (0.9, 0.95): ceil(q x n) - 1 <= n - 1, the clamp never "
        "binds",
    ("tasks.extraction.pacing.xǁEndpointǁ_cut",
     "self._set(min(self.limit + 1, round(self.limit * DECREASE)))"):
        "round(0.7 x limit) < limit for every limit >= 2, and at 1 _set clamps to 1: the first "
        "term of the min never binds",
    **{(f"tasks.extraction.pacing.xǁEndpointǁ{f}", "self.slow_start = None"):
       "slow_start is " + AS_CONDITION
       for f in ("_cut", "_decide")},
    ("tasks.extraction.pacing.xǁEndpointǁ__init__",
     "self._settling = None  # a decrease left requests of the higher limit in flight"):
        "_settling is " + AS_CONDITION,
    ("tasks.extraction.pacing.xǁPacingǁ__init__",
     "self.closed = None  # the gate closed once: every later request defers at once"):
        "closed is " + AS_CONDITION,
    **{("tasks.extraction.pacing.xǁPacingǁ__init__", line):
       "_condition() replaces both before either is read: no running loop is the empty string"
       for line in ('self._cond: asyncio.Condition | None = ""',
                    'self._loop: asyncio.AbstractEventLoop | None = ""')},
}


def _new_lines(mutmut: Path, name: str) -> list[str]:
    diff = subprocess.run([str(mutmut), "show", name], capture_output=True, text=True).stdout
    return [line[1:].strip() for line in diff.splitlines()
            if line.startswith("+") and not line.startswith("+++")]


def equivalent(mutmut: Path, name: str) -> str | None:
    """Why the mutant is equivalent, or None."""
    function = name.rsplit("__mutmut_", 1)[0]
    for line in _new_lines(mutmut, name):
        if (function, line) in EQUIVALENT:
            return EQUIVALENT[function, line]
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("patterns", nargs="+", help="mutant name patterns (fnmatch)")
    ap.add_argument("--min", type=float, default=80.0, help="lowest passing score, percent")
    args = ap.parse_args(argv)
    mutmut = Path(sys.executable).parent / "mutmut"
    out = subprocess.run([str(mutmut), "results", "--all", "true"], capture_output=True,
                         text=True, check=True).stdout
    by_module: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for line in out.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name and any(fnmatch.fnmatch(name, p) for p in args.patterns):
            module = re.split(r"\.x[_ǁ]", name, maxsplit=1)[0]
            by_module[module].append((name, status))
    if not by_module:
        print("no mutants match — run `make mutation` first", file=sys.stderr)
        return 1
    total = killed = excluded = 0
    for module, rows in sorted(by_module.items()):
        survivors = [(n, s) for n, s in rows if s not in KILLED]
        why = {n: equivalent(mutmut, n) for n, s in survivors if s == "survived"}
        n_total = len(rows) - sum(1 for w in why.values() if w)
        k = len(rows) - len(survivors)
        total, killed, excluded = total + n_total, killed + k, excluded + len(rows) - n_total
        print(f"{module}: {k}/{n_total} killed ({100 * k / max(n_total, 1):.1f} %)")
        for name, status in survivors:
            print(f"    equivalent: {name} — {why[name]}" if why.get(name)
                  else f"    {status}: {name}")
    score = 100 * killed / max(total, 1)
    print(f"total: {killed}/{total} killed ({score:.1f} %; {excluded} equivalent mutants "
          f"excluded), minimum {args.min:g} %")
    return 0 if score >= args.min else 1


if __name__ == "__main__":
    sys.exit(main())
