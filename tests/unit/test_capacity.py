"""The capacity report (tasks/extraction/capacity.py) and its lines in the run summary
(tasks/night/summary.py).

Every expected number is worked out by hand in the test's comments, from the inputs."""

from __future__ import annotations

import json

import pytest

from tasks.extraction.capacity import Phase1Measured, capacity_report
from tasks.night.summary import capacity_lines, new_summary, render_markdown, render_text
from tasks.records import CapacityReport, RunSummary
from tasks.shared.errors import RecordError


def test_one_node_with_a_backlog_of_two_nights() -> None:
    # 90 documents in 5,400 s (1.5 h): 60.0 documents/h, 27,000 / 1.5 = 18,000 output tokens/h,
    # 180,000 / 1.5 = 120,000 prompt tokens/h. 60 s a document: 230 documents take 13,800 s,
    # 1.92 budgets of 7,200 s → 2 nights, or 2 nodes (1 × 1.92 → 2). Output: 300 tokens a
    # document × 230 = 69,000.
    c = capacity_report(Phase1Measured(
        extracted_documents=90, completion_tokens=27_000, prompt_tokens=180_000,
        phase1_seconds=5400.0, backlog_documents=230, backlog_tokens=805_000),
        phase1_budget_seconds=7200.0, nodes=1)
    assert c.model_dump() == {
        "nodes": 1, "phase1_seconds": 5400.0, "phase1_budget_seconds": 7200.0,
        "documents_per_hour": 60.0, "output_tokens_per_hour": 18_000,
        "prompt_tokens_per_hour": 120_000, "backlog_documents": 230, "backlog_tokens": 805_000,
        "backlog_output_tokens": 69_000, "nights_to_clear": 2, "nodes_to_clear_in_one_night": 2,
        "note": None}
    assert capacity_lines(c) == [
        "Capacity: 60.0 documents/h, 18,000 output tokens/h on 1 node (phase 1 extracting "
        "5,400 s of a 7,200 s budget)",
        "  backlog 230 documents (~805.0 k tokens in, ~69.0 k out) · 2 nights at tonight's "
        "rate, or 2 nodes for one night"]


def test_nodes_for_one_night_scale_tonight_s_per_node_rate() -> None:
    # 2 nodes, 100 documents in 3,000 s: 120.0 documents/h (30 s a document on both nodes);
    # 50,000 output tokens → 60,000/h, 500 a document. 500 documents: 15,000 s on 2 nodes =
    # 4.17 budgets of 3,600 s → 5 nights; on one night 2 × 4.17 = 8.33 → 9 nodes.
    # Output: 500 × 500 = 250,000 (~250.0 k); 2,500,000 prompt tokens → ~2.5 M.
    c = capacity_report(Phase1Measured(
        extracted_documents=100, completion_tokens=50_000, prompt_tokens=0, phase1_seconds=3000.0,
        backlog_documents=500, backlog_tokens=2_500_000), phase1_budget_seconds=3600.0, nodes=2)
    assert (c.documents_per_hour, c.output_tokens_per_hour, c.prompt_tokens_per_hour) == \
        (120.0, 60_000, 0)
    assert (c.backlog_output_tokens, c.nights_to_clear, c.nodes_to_clear_in_one_night) == \
        (250_000, 5, 9)
    assert capacity_lines(c)[1] == ("  backlog 500 documents (~2.5 M tokens in, ~250.0 k out) · "
                                    "5 nights at tonight's rate, or 9 nodes for one night")


def test_a_small_backlog_never_asks_for_fewer_nodes_than_tonight() -> None:
    # 2 nodes, 100 documents in 3,600 s: 36 s a document. 10 documents: 360 s = 0.05 of a
    # 7,200 s budget → 1 night; 2 × 0.05 = 0.1 → 1 node, but tonight ran 2: 2.
    c = capacity_report(Phase1Measured(
        extracted_documents=100, completion_tokens=1000, prompt_tokens=1000, phase1_seconds=3600.0,
        backlog_documents=10, backlog_tokens=999), phase1_budget_seconds=7200.0, nodes=2)
    assert (c.nights_to_clear, c.nodes_to_clear_in_one_night) == (1, 2)
    # 1,000 output tokens / 100 documents = 10 a document × 10 = 100
    assert capacity_lines(c)[1] == ("  backlog 10 documents (~999 tokens in, ~100 out) · 1 night "
                                    "at tonight's rate, or 2 nodes for one night")


def test_no_backlog_takes_no_nights_and_no_nodes() -> None:
    # 7 documents in 1,234 s: 3,600 / 1,234 = 2.91734 an hour → 7 × = 20.42 → 20.4 documents/h,
    # 1,001 × = 2,920.26 → 2,920 output tokens/h, 5,000 × = 14,586.7 → 14,587 prompt tokens/h
    c = capacity_report(Phase1Measured(
        extracted_documents=7, completion_tokens=1001, prompt_tokens=5000, phase1_seconds=1234.0,
        backlog_documents=0, backlog_tokens=0), phase1_budget_seconds=7200.0, nodes=1)
    assert (c.documents_per_hour, c.output_tokens_per_hour, c.prompt_tokens_per_hour) == \
        (20.4, 2920, 14_587)
    assert (c.backlog_output_tokens, c.nights_to_clear, c.nodes_to_clear_in_one_night,
            c.note) == (0, 0, 0, None)
    assert capacity_lines(c) == [
        "Capacity: 20.4 documents/h, 2,920 output tokens/h on 1 node (phase 1 extracting "
        "1,234 s of a 7,200 s budget)", "  backlog: none"]


def test_nothing_extracted_with_a_backlog_gives_no_estimate_and_says_why() -> None:
    c = capacity_report(Phase1Measured(
        extracted_documents=0, completion_tokens=0, prompt_tokens=0, phase1_seconds=120.0,
        backlog_documents=40, backlog_tokens=12_345), phase1_budget_seconds=7200.0, nodes=1)
    assert (c.documents_per_hour, c.output_tokens_per_hour, c.prompt_tokens_per_hour) == \
        (0.0, 0, 0)
    assert (c.backlog_output_tokens, c.nights_to_clear, c.nodes_to_clear_in_one_night) == \
        (None, None, None)
    assert c.note == ("no estimate for the backlog: nothing was extracted tonight, so no rate "
                      "was measured")
    assert capacity_lines(c)[1] == ("  backlog 40 documents (~12.3 k tokens in) · no estimate "
                                    "for the backlog: nothing was extracted tonight, so no rate "
                                    "was measured")
    # documents counted in no time (phase 1 did not run its batches): no rate either, no
    # division by zero
    c = capacity_report(Phase1Measured(
        extracted_documents=5, completion_tokens=50, prompt_tokens=50, phase1_seconds=0.0,
        backlog_documents=3, backlog_tokens=30), phase1_budget_seconds=None, nodes=1)
    assert (c.documents_per_hour, c.nights_to_clear, c.nodes_to_clear_in_one_night) == \
        (0.0, None, None)


def test_without_a_budget_a_night_is_tonight_s_phase_1_time() -> None:
    # 3 documents in 3,641.1 s, 9 pending: 9 × 3,641.1 / 3 / 3,641.1 = exactly 3 nights (in
    # floating point 3.0000000000000004, which a bare ceil makes 4), or 3 nodes. 3 documents an
    # 1.0114 h → 3 × 3,600 / 3,641.1 = 2.966 → 3.0 documents/h; 600 × = 593.2 → 593.
    c = capacity_report(Phase1Measured(
        extracted_documents=3, completion_tokens=600, prompt_tokens=900, phase1_seconds=3641.1,
        backlog_documents=9, backlog_tokens=9000), phase1_budget_seconds=None, nodes=1)
    assert (c.phase1_budget_seconds, c.documents_per_hour, c.output_tokens_per_hour) == \
        (None, 3.0, 593)
    assert (c.nights_to_clear, c.nodes_to_clear_in_one_night, c.backlog_output_tokens) == \
        (3, 3, 1800)
    assert c.note == "no phase-1 budget given: a night is tonight's phase-1 time"
    assert capacity_lines(c) == [
        "Capacity: 3.0 documents/h, 593 output tokens/h on 1 node (phase 1 extracting 3,641 s)",
        "  backlog 9 documents (~9.0 k tokens in, ~1.8 k out) · 3 nights at tonight's rate, or "
        "3 nodes for one night (no phase-1 budget given: a night is tonight's phase-1 time)"]


def test_a_budget_of_nothing_gives_no_estimate() -> None:
    c = capacity_report(Phase1Measured(
        extracted_documents=10, completion_tokens=100, prompt_tokens=100, phase1_seconds=60.0,
        backlog_documents=5, backlog_tokens=50), phase1_budget_seconds=0.0, nodes=1)
    assert (c.nights_to_clear, c.nodes_to_clear_in_one_night, c.backlog_output_tokens) == \
        (None, None, 50)
    assert c.note == "no estimate for the backlog: a phase-1 budget of 0 s holds no work"


@pytest.mark.parametrize(("field", "value"), [
    ("extracted_documents", -1), ("completion_tokens", -2), ("prompt_tokens", -3),
    ("phase1_seconds", -0.5), ("backlog_documents", -1), ("backlog_tokens", -7)])
def test_impossible_inputs_are_refused_by_name(field: str, value: float) -> None:
    args = {"extracted_documents": 1, "completion_tokens": 1, "prompt_tokens": 1,
            "phase1_seconds": 1.0, "backlog_documents": 0, "backlog_tokens": 0, field: value}
    with pytest.raises(ValueError) as e:
        capacity_report(Phase1Measured(**args), phase1_budget_seconds=1.0, nodes=1)  # type: ignore[arg-type]
    assert str(e.value) == (f"capacity_report: {field} = {value} is negative; pass the count "
                            "or time phase 1 measured (0 when none)")
    with pytest.raises(ValueError) as e:
        capacity_report(Phase1Measured(**{**args, field: 0}),  # type: ignore[arg-type]
                        phase1_budget_seconds=1.0, nodes=0)
    assert str(e.value) == ("capacity_report: nodes = 0; pass the number of nodes phase 1 "
                            "ran on (at least 1)")


def test_one_document_in_half_a_second_is_a_rate_and_half_a_second_a_budget() -> None:
    # 1 document in 0.46 s (7,826.1 documents/h; shown 0.5 s), 2 pending on a 0.5 s budget:
    # 2 × 0.46 / 1 / 0.5 = 1.84 → 2 nights, or 2 nodes
    c = capacity_report(Phase1Measured(
        extracted_documents=1, completion_tokens=10, prompt_tokens=10, phase1_seconds=0.46,
        backlog_documents=2, backlog_tokens=20), phase1_budget_seconds=0.5, nodes=1)
    assert (c.phase1_seconds, c.documents_per_hour, c.nights_to_clear,
            c.nodes_to_clear_in_one_night, c.note) == (0.5, 7826.1, 2, 2, None)


def test_every_reason_for_no_estimate_is_in_the_note() -> None:
    c = capacity_report(Phase1Measured(
        extracted_documents=0, completion_tokens=0, prompt_tokens=0, phase1_seconds=0.0,
        backlog_documents=4, backlog_tokens=40), phase1_budget_seconds=None, nodes=1)
    assert c.note == ("no phase-1 budget given: a night is tonight's phase-1 time; no estimate "
                      "for the backlog: nothing was extracted tonight, so no rate was measured")


def test_the_summary_carries_and_renders_the_capacity() -> None:
    s = new_summary("gce")
    assert "capacity" not in s.to_dict() and "Capacity" not in render_text(s)
    # 1,000 documents in 3,600 s on 1 node; 250 pending take 900 s of a 7,200 s budget: 1 night
    s.capacity = capacity_report(Phase1Measured(
        extracted_documents=1000, completion_tokens=123_456, prompt_tokens=1,
        phase1_seconds=3600.0, backlog_documents=250, backlog_tokens=1_000_000),
        phase1_budget_seconds=7200.0, nodes=1)
    again = RunSummary.parse(json.loads(s.to_json()), "test")
    assert again.capacity == s.capacity
    assert again.to_dict()["capacity"]["nodes_to_clear_in_one_night"] == 1
    assert render_markdown(again).endswith(
        "Capacity: 1,000.0 documents/h, 123,456 output tokens/h on 1 node (phase 1 extracting "
        "3,600 s of a 7,200 s budget) · backlog 250 documents (~1.0 M tokens in, ~30.9 k out) · "
        "1 night at tonight's rate, or 1 node for one night")
    assert "  backlog 250 documents (~1.0 M tokens in, ~30.9 k out) · 1 night" in \
        render_text(again)


def test_a_misspelled_capacity_key_fails() -> None:
    c = capacity_report(Phase1Measured(
        extracted_documents=1, completion_tokens=1, prompt_tokens=1, phase1_seconds=1.0,
        backlog_documents=0, backlog_tokens=0), phase1_budget_seconds=1.0, nodes=1).model_dump()
    with pytest.raises(ValueError, match="nights_to_clr"):
        CapacityReport.model_validate({**c, "nights_to_clr": 1})
    with pytest.raises(RecordError, match="capacity.backlog_doc: Extra inputs are not permitted"):
        RunSummary.parse({"profile": "p", "capacity": {**c, "backlog_doc": 1}}, "test")
