"""The resolution eval's scores (tasks/evaluation/resolution.py), worked out by hand."""

import pytest

from tasks.evaluation.resolution import bcubed, gate, pairwise

# four mentions: a and b put together (b truly belongs with c and d), c and d together
PRED = {"a": 1, "b": 1, "c": 2, "d": 2}
TRUTH = {"a": "X", "b": "Y", "c": "Y", "d": "Y"}


def test_pairwise_counts_the_pairs_put_together() -> None:
    # put together: (a,b) wrong, (c,d) right; truly together: (b,c), (b,d), (c,d)
    assert pairwise(PRED, TRUTH) == (1 / 2, 1 / 3)
    assert pairwise({"a": 1}, {"a": "X"}) == (1.0, 1.0)  # no pair to judge


def test_bcubed_averages_each_mentions_shares() -> None:
    # precision: a 1/2, b 1/2, c 1, d 1; recall: a 1, b 1/3, c 2/3, d 2/3
    p, r = bcubed(PRED, TRUTH)
    assert p == pytest.approx(3 / 4)
    assert r == pytest.approx((1 + 1 / 3 + 2 / 3 + 2 / 3) / 4)


def test_the_gate_names_each_figure_under_its_floor_and_any_namesake_merged() -> None:
    figures = {"pairwise_precision": 1.0, "bcubed_precision": 0.98, "pairwise_recall": 0.95,
               "bcubed_recall": 0.95}
    ok = {"people": {**figures, "namesakes_merged": 0}, "organizations": figures}
    assert gate(ok) == []
    bad = {"people": {**figures, "bcubed_precision": 0.979, "namesakes_merged": 2},
           "organizations": {**figures, "pairwise_recall": 0.9}}
    assert gate(bad) == ["people bcubed_precision 0.979 < 0.98",
                         "organizations pairwise_recall 0.900 < 0.95",
                         "2 entities hold namesakes"]


def test_no_mention_is_nothing_wrong() -> None:
    assert bcubed({}, {}) == pairwise({}, {}) == (1.0, 1.0)
