"""Near duplicates: exact Jaccard values worked out by hand, the threshold and shortlist
boundaries on hand-made signatures, the LSH candidates, what part of a pair is compared, and
a brute-force check of the whole pass against all pairs on a few thousand rows."""

import random

import numpy as np
import polars as pl
import polars.testing
import pytest

from tasks.corpus.scorecard import (
    ANSWER_HEAD,
    QUESTION_TAIL,
    _jaccard,
    _near_from_signatures,
    _normalized,
    _pair_text,
    _shingles,
    jaccards,
    near_duplicates,
    signatures,
)


@pytest.mark.parametrize(("a", "b", "want"), [
    ("a b c d e f", "a b c d e", 4 / 5),  # bigrams ab bc cd de | ab bc cd de ef
    ("a b c", "a b c", 1.0),
    ("a b c", "c b a", 0.0),  # same words, no bigram in common
    ("a b a b", "a b", 1 / 2),  # {ab, ba} vs {ab}
    ("a b c d", "a b x d", 1 / 5),  # {ab bc cd} vs {ab bx xd}: 1 shared of 5
    ("a", "a", 1.0),  # one word: the word is the shingle
    ("a", "a b", 0.0),  # {"a"} vs {(a, b)}
    ("", "", 1.0),  # two empty texts are equal
    ("", "a b", 0.0),
    ("  a   b  ", "a b", 1.0),  # runs of spaces are no words
])
def test_jaccard_of_word_bigrams_by_hand(a: str, b: str, want: float) -> None:
    assert _jaccard(a, b) == want
    assert _jaccard(b, a) == want


def test_shingles_are_word_pairs_or_the_lone_word() -> None:
    assert _shingles("x y z") == {("x", "y"), ("y", "z")}
    assert _shingles("solo") == {"solo"}
    assert _shingles("") == set()


def test_jaccards_follows_ids_not_positions() -> None:
    frame = pl.DataFrame({"id": [7, 3, 9], "norm": ["a b c d e f", "a b c d e", "q r"]},
                         schema={"id": pl.UInt32, "norm": pl.String})
    got = jaccards(frame, np.array([7, 9, 3]), np.array([3, 7, 3]))
    assert got.tolist() == [0.8, 0.0, 1.0]


def sig(ids: list[int], rows: list[list[int]]) -> pl.DataFrame:
    """A signature frame from hand-written hash values (8 per row)."""
    cols = {f"s{i}": [r[i] for r in rows] for i in range(8)}
    return pl.DataFrame({**cols, "id": ids},
                        schema={**{f"s{i}": pl.UInt64 for i in range(8)}, "id": pl.UInt32})


def near(sigs: pl.DataFrame, texts: dict[int, str], threshold: float) -> list[int]:
    def lookup(ids: pl.Series) -> pl.DataFrame:
        return pl.DataFrame({"id": ids, "norm": [texts[i] for i in ids.to_list()]},
                            schema={"id": pl.UInt32, "norm": pl.String})

    return _near_from_signatures(sigs, lookup, threshold).to_list()


SAME = [1, 2, 3, 4, 5, 6, 7, 8]


def test_a_pair_exactly_at_the_threshold_is_a_near_duplicate() -> None:
    s = sig([10, 20], [SAME, SAME])
    texts = {10: "a b c d e f", 20: "a b c d e"}  # Jaccard 4/5
    assert near(s, texts, 0.8) == [20]  # the later row is the duplicate
    assert near(s, texts, 0.81) == []


def test_the_signature_shortlist_keeps_pairs_agreeing_on_threshold_minus_035() -> None:
    texts = {0: "the same words here", 1: "the same words here"}
    # bands share s0,s1 and s2,s3; the pair agrees on 4 of 8 hashes: 0.5 = 0.85 - 0.35
    four = sig([0, 1], [SAME, [1, 2, 3, 4, 50, 60, 70, 80]])
    assert near(four, texts, 0.85) == [1]
    # 3 of 8 (0.375) is below 0.8 - 0.35: never compared, though the texts are equal
    three = sig([0, 1], [SAME, [1, 2, 3, 40, 50, 60, 70, 80]])
    assert near(three, texts, 0.8) == []
    assert near(three, texts, 0.7) == [1]  # 0.375 >= 0.35


def test_pairs_that_share_no_band_are_never_candidates() -> None:
    texts = {0: "x y z", 1: "x y z"}
    # 4 of 8 hashes agree, but no band (s0s1, s2s3, s4s5, s6s7) agrees whole
    s = sig([0, 1], [SAME, [1, 20, 3, 40, 5, 60, 7, 80]])
    assert near(s, texts, 0.5) == []


def test_each_bucket_row_is_compared_with_the_first_and_its_predecessor() -> None:
    # all three rows share bands 0 and 1 (4 of 8 hashes): one bucket per band
    rows = [[1, 2, 3, 4, 10 * i + 5, 10 * i + 6, 10 * i + 7, 10 * i + 8] for i in range(3)]
    s = sig([0, 1, 2], rows)
    x, y = "alpha beta gamma delta", "one two three four five"
    # the partner is the bucket's predecessor, not its first row
    assert near(s, {0: x, 1: y, 2: y}, 0.5) == [2]
    # the partner is the bucket's first row, not the predecessor
    assert near(s, {0: y, 1: x, 2: y}, 0.5) == [2]
    # every row equal: each later row is a duplicate, once
    assert near(s, {0: y, 1: y, 2: y}, 0.5) == [1, 2]


def test_fewer_than_two_rows_have_no_duplicates() -> None:
    assert near(sig([], []), {}, 0.8) == []
    assert near(sig([4], [SAME]), {4: "a b"}, 0.8) == []


def test_signatures_of_equal_texts_are_equal_and_of_empty_text_zero() -> None:
    s = signatures(pl.Series(["a b c d", "a b c d", "", "z y x w"]))
    rows = s.rows()
    assert s.columns == [f"s{i}" for i in range(8)] and s.height == 4
    assert rows[0] == rows[1] and rows[2] == (0,) * 8 and rows[3] != rows[0]
    # chunking does not change a signature
    assert signatures(pl.Series(["a b c d", "a b c d", "", "z y x w"]), chunk=1).rows() == rows


def pair_frame(question: str, answer: str) -> pl.DataFrame:
    return pl.DataFrame({"messages": [[{"role": "user", "content": "context " * 80},
                                       {"role": "user", "content": question},
                                       {"role": "assistant", "content": answer}]]})


def test_a_pair_is_compared_by_its_question_tail_and_answer_head() -> None:
    question = "Q" * 100 + "q" * QUESTION_TAIL
    answer = "a" * ANSWER_HEAD + "A" * 100
    got = pair_frame(question, answer).select(_pair_text("sft")).item()
    assert got == "q" * QUESTION_TAIL + " " + "a" * ANSWER_HEAD
    dpo = pl.DataFrame({"prompt": [[{"role": "user", "content": question}]],
                        "chosen": [[{"role": "assistant", "content": "c" * 700}]],
                        "rejected": [[{"role": "assistant", "content": "r1"},
                                      {"role": "assistant", "content": "r2"}]]})
    assert dpo.select(_pair_text("dpo")).item() == \
        "q" * QUESTION_TAIL + " " + "c" * ANSWER_HEAD + " " + "r1 r2"
    assert pl.select(_normalized(pl.lit("Hi, THERE!\nYou"))).item() == "hi  there  you"


def test_different_questions_after_a_long_shared_context_are_not_duplicates() -> None:
    shared = " ".join(f"w{i}" for i in range(200))  # far longer than the question tail
    # each question alone fills the compared tail (80 words, over 300 characters)
    questions = [" ".join(f"{p}{i}" for i in range(80)) for p in ("qa", "qb")]
    rows = pl.concat([pair_frame(shared + " " + q, a) for q, a in zip(
        questions, ["they approved it on monday", "the minister for transport does"],
        strict=True)])
    norm = rows.select(norm=_normalized(_pair_text("sft")))["norm"]
    assert _jaccard(norm[0], norm[1]) == 0.0
    frame = pl.DataFrame({"id": [0, 1], "norm": norm}, schema={"id": pl.UInt32, "norm": pl.String})
    assert near_duplicates(frame, 0.8).to_list() == []


def brute_force(texts: list[str], threshold: float) -> set[int]:
    """Rows with an earlier row at Jaccard >= threshold, by the definition: all pairs (pairs
    that share no shingle have Jaccard 0, so an inverted index lists every other pair)."""
    shingles = [_shingles(t) for t in texts]
    index: dict[object, list[int]] = {}
    out = set()
    for j, sh in enumerate(shingles):
        earlier = {i for s in sh for i in index.get(s, [])}
        for i in earlier:
            common = len(shingles[i] & sh)
            if common / (len(shingles[i]) + len(sh) - common) >= threshold:
                out.add(j)
                break
        for s in sh:
            index.setdefault(s, []).append(j)
    return out


def test_lsh_finds_what_all_pairs_finds_on_3000_rows() -> None:
    rnd = random.Random(11)
    vocab = [f"w{i}" for i in range(5000)]
    texts: list[str] = []
    for _ in range(3000):
        r = rnd.random()
        if texts and r < 0.1:  # a copy with one word appended: Jaccard 39/40
            texts.append(rnd.choice(texts[-200:]) + " " + rnd.choice(vocab))
        elif texts and r < 0.15:  # half of a row, half new: Jaccard well under 0.5
            base = rnd.choice(texts).split()
            texts.append(" ".join(base[:20] + rnd.choices(vocab, k=20)))
        else:
            texts.append(" ".join(rnd.choices(vocab, k=40)))
    frame = pl.DataFrame({"id": range(len(texts)), "norm": texts},
                         schema={"id": pl.UInt32, "norm": pl.String})
    want = brute_force(texts, 0.8)
    assert len(want) > 250  # the planted copies (~300), and nothing else
    assert set(near_duplicates(frame, 0.8).to_list()) == want


def test_a_pair_with_fewer_turns_than_the_compared_ones_compares_empty_text() -> None:
    """An SFT row of one message has no question turn (-2): it compares as empty, not as an
    error; the same for a DPO row with an empty prompt."""
    sft = pl.DataFrame({"messages": [[{"role": "assistant", "content": "only an answer"}]]})
    assert sft.select(_pair_text("sft")).item() == " only an answer"
    dpo = pl.DataFrame({"prompt": [[{"role": "user", "content": "q"}][:0]],
                        "chosen": [[{"role": "assistant", "content": "yes"}]],
                        "rejected": [[{"role": "assistant", "content": "no"}]]},
                       schema={c: pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
                               for c in ("prompt", "chosen", "rejected")})
    assert dpo.select(_pair_text("dpo")).item() == " yes no"


ID = pl.Series("id", [], dtype=pl.UInt32)


def test_the_result_and_the_text_lookup_are_uint32_ids_named_id() -> None:
    asked: list[pl.Series] = []

    def lookup(ids: pl.Series) -> pl.DataFrame:
        asked.append(ids)
        texts = {10: "a b c d e f", 20: "a b c d e", 30: "x y"}
        return pl.DataFrame({"id": ids, "norm": [texts[i] for i in ids.to_list()]},
                            schema={"id": pl.UInt32, "norm": pl.String})

    other = [9, 9, 9, 9, 9, 9, 9, 9]
    got = _near_from_signatures(sig([10, 20, 30], [SAME, SAME, other]), lookup, 0.8)
    pl.testing.assert_series_equal(got, pl.Series("id", [20], dtype=pl.UInt32))
    pl.testing.assert_series_equal(asked[0], pl.Series("id", [10, 20], dtype=pl.UInt32))
    # one row, and rows with no candidate at all: empty, of the same name and type
    pl.testing.assert_series_equal(_near_from_signatures(sig([10], [SAME]), lookup, 0.8), ID)
    pl.testing.assert_series_equal(
        _near_from_signatures(sig([10, 30], [SAME, other]), lookup, 0.8), ID)


@pytest.mark.parametrize("band", [0, 1, 2, 3])
def test_rows_that_agree_on_one_band_alone_are_candidates(band: int) -> None:
    """A band is hashes 2b and 2b+1: two rows equal there and nowhere else share a bucket
    (agreement 2/8 = 0.25, kept by the shortlist for a threshold of 0.6)."""
    a = [1, 2, 3, 4, 5, 6, 7, 8]
    b = [11, 12, 13, 14, 15, 16, 17, 18]
    b[2 * band], b[2 * band + 1] = a[2 * band], a[2 * band + 1]
    texts = {10: "a b c", 20: "a b c"}
    assert near(sig([10, 20], [a, b]), texts, 0.6) == [20]
    c = list(b)
    c[2 * band + 1] = 99  # one hash of the band differs: not a candidate
    assert near(sig([10, 20], [a, c]), texts, 0.6) == []
