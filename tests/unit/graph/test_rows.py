"""The rows a store checks before any Cypher, and how batches are cut by rows and bytes
(tasks/graph/store.py). The server's own refusals, which these checks come before, are shown on
a real Neo4j in tests/integration/test_graph_store.py."""

from __future__ import annotations

import pytest

from tasks.graph.store import check_row, sized_batches, value_bytes
from tasks.shared.errors import GraphError


@pytest.mark.parametrize(("value", "size"), [
    ("", 0), ("abc", 3), ("é", 2), ("日本", 6), (7, 8), (1.5, 8), (True, 8), (None, 8),
    ([], 8), (["ab", "c"], 11), ({"k": "vv"}, 3), ({"key": ["a"]}, 12), (("a",), 9),
])
def test_value_bytes_counts_utf8_text_eight_per_number_and_sums_lists_and_maps(
        value: object, size: int) -> None:
    assert value_bytes(value) == size


def test_batches_cut_at_the_row_count() -> None:
    assert [list(b) for b in sized_batches(list("abcdefg"), 3, 1 << 20)] == [
        ["a", "b", "c"], ["d", "e", "f"], ["g"]]


def test_batches_cut_before_the_row_that_would_pass_the_bytes() -> None:
    rows = ["x" * 4, "x" * 4, "x" * 4, "x" * 9, "x"]
    assert [len(b) for b in sized_batches(rows, 100, 8)] == [2, 1, 1, 1]
    assert [len(b) for b in sized_batches(rows, 100, 9)] == [2, 1, 1, 1]
    assert [len(b) for b in sized_batches(rows, 100, 12)] == [3, 2]


def test_a_row_larger_than_the_bytes_goes_alone_and_nothing_is_dropped() -> None:
    rows = ["a", "b" * 50, "c"]
    assert [list(b) for b in sized_batches(rows, 10, 10)] == [["a"], ["b" * 50], ["c"]]
    assert list(sized_batches([], 10, 10)) == []


def test_batches_weigh_rows_as_told() -> None:
    rows = [{"id": "a", "bytes": 6}, {"id": "b", "bytes": 6}, {"id": "c", "bytes": 1}]
    cut = sized_batches(rows, 10, 10, lambda r: int(r["bytes"]))
    assert [[r["id"] for r in b] for b in cut] == [["a"], ["b", "c"]]


def test_rows_neo4j_stores_pass() -> None:
    check_row("entity 'x'", {"key": "x", "n": 3, "f": 0.5, "ok": False, "none": None,
                             "names": ["a", "b"], "ints": [1, 2], "floats": [1.0, 2.5],
                             "empty": [], "properties": {"role": "chair", "n": 2}},
              ("properties",))


@pytest.mark.parametrize(("row", "why"), [
    ({"emails": ["a", None]}, "field emails holds a null at index 1 (a stored list has no "
                              "nulls)"),
    ({"aliases": ["a", 1]}, "field aliases mixes types (a stored list holds one type)"),
    ({"aliases": [True, 1]}, "field aliases mixes types (a stored list holds one type)"),
    ({"aliases": [1, "1"]}, "field aliases mixes types (a stored list holds one type)"),
    ({"scores": [1, 2.5]}, "field scores mixes types (a stored list holds one type)"),
    ({"aliases": [["a"]]}, "field aliases holds a list at index 0 (a stored list holds "
                           "scalars)"),
    ({"d": {"a": 1}}, "field d is a map (a property holds a value or a list, never a map)"),
    ({"d": b"x"}, "field d is a bytes (a property holds text, a number or a boolean)"),
    ({"properties": {"role": None}}, "field properties.role is null (SET += would drop the "
                                     "property)"),
    ({"properties": {"role": {"a": 1}}}, "field properties.role is a map (a property holds a "
                                         "value or a list, never a map)"),
    ({"properties": {"tags": ["a", None]}}, "field properties.tags holds a null at index 1 (a "
                                            "stored list has no nulls)"),
])
def test_a_row_neo4j_would_refuse_names_its_field_and_the_fix(row: dict, why: str) -> None:
    with pytest.raises(GraphError) as err:
        check_row("entity 'Person:bob'", row, ("properties",))
    assert str(err.value) == (f"entity 'Person:bob': {why} — fix the row's source (the "
                              "extraction's output or its mapping)")


def test_a_map_outside_the_nested_fields_is_refused_whatever_its_name() -> None:
    with pytest.raises(GraphError, match="field properties is a map"):
        check_row("document 'd'", {"properties": {"role": "chair"}})


def test_batches_fill_to_exactly_the_bytes_after_each_cut_and_never_yield_an_empty_one() -> None:
    assert [len(b) for b in sized_batches(["xxxx"] * 4, 100, 8)] == [2, 2]
    assert [list(b) for b in sized_batches(["y" * 20, "a"], 10, 10)] == [["y" * 20], ["a"]]


def test_the_fields_after_a_property_map_are_checked_too() -> None:
    with pytest.raises(GraphError, match="field emails holds a null at index 0"):
        check_row("entity 'x'", {"properties": {"role": "chair"}, "emails": [None]},
                  ("properties",))
