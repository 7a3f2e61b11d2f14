"""The night's capacity (the run summary's `capacity`): what phase 1 did per hour tonight, the
backlog it left, and what clearing that backlog takes — more nights at tonight's rate, or more
nodes for one night.

The estimate counts documents: the backlog takes tonight's seconds per document, so its
output tokens are tonight's output tokens per document times its documents (the decode-bound
phase spends its time on output tokens, so both measures give the same time). Nodes scale
linearly (bench/scale_out.py measures ≥ 0.9 × N for N endpoints). Rates are taken over the time
phase 1 spent extracting, not over the night.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tasks.records import CapacityReport

HOUR = 3600.0


def _ceil(x: float) -> int:
    # 2.0000000000000004 (float noise in a ratio that is exactly 2) must not become 3 nights
    return math.ceil(round(x, 9))


@dataclass(frozen=True)
class Phase1Measured:
    """What phase 1 did tonight: the documents it extracted and their tokens, the seconds it
    spent extracting, and the backlog it left (documents still pending, and the estimated
    prompt tokens of their text)."""

    extracted_documents: int
    completion_tokens: int
    prompt_tokens: int
    phase1_seconds: float
    backlog_documents: int = 0
    backlog_tokens: int = 0


def capacity_report(tonight: Phase1Measured, *, phase1_budget_seconds: float | None,
                    nodes: int) -> CapacityReport:
    """Tonight's phase-1 rates and the backlog's cost in nights or nodes.

    `phase1_budget_seconds`: one night's phase-1 budget
    (None: tonight's phase-1 time stands for it). `nights_to_clear`: nights of that budget at
    tonight's rate. `nodes_to_clear_in_one_night`: the node count for clearing the backlog in one
    such night at tonight's per-node rate, never fewer than tonight's `nodes` — a backlog means
    tonight's nodes were not enough, and tomorrow brings new documents besides the backlog.
    With no backlog both are 0. Without a measured rate (nothing extracted, or no time spent)
    or without a positive budget they are None and `note` says why."""
    m = tonight
    extracted_documents, completion_tokens, prompt_tokens = (
        m.extracted_documents, m.completion_tokens, m.prompt_tokens)
    phase1_seconds, backlog_documents, backlog_tokens = (
        m.phase1_seconds, m.backlog_documents, m.backlog_tokens)
    for name, value in (("extracted_documents", extracted_documents),
                        ("completion_tokens", completion_tokens),
                        ("prompt_tokens", prompt_tokens), ("phase1_seconds", phase1_seconds),
                        ("backlog_documents", backlog_documents),
                        ("backlog_tokens", backlog_tokens)):
        if value < 0:
            raise ValueError(f"capacity_report: {name} = {value} is negative; pass the count "
                             "or time phase 1 measured (0 when none)")
    if nodes < 1:
        raise ValueError(f"capacity_report: nodes = {nodes}; pass the number of nodes phase 1 "
                         "ran on (at least 1)")
    measured = extracted_documents > 0 and phase1_seconds > 0
    per_hour = HOUR / phase1_seconds if measured else 0.0
    budget = phase1_seconds if phase1_budget_seconds is None else phase1_budget_seconds
    notes = []
    if phase1_budget_seconds is None:
        notes.append("no phase-1 budget given: a night is tonight's phase-1 time")
    nights: int | None = 0
    more_nodes: int | None = 0
    backlog_out: int | None = 0
    if backlog_documents and not measured:
        nights = more_nodes = backlog_out = None
        notes.append("no estimate for the backlog: nothing was extracted tonight, so no rate "
                     "was measured")
    elif backlog_documents and budget <= 0:
        nights = more_nodes = None
        notes.append(f"no estimate for the backlog: a phase-1 budget of {budget:g} s holds "
                     "no work")
    if backlog_documents and measured:
        backlog_out = round(backlog_documents * completion_tokens / extracted_documents)
    if backlog_documents and nights is not None:
        # the backlog's phase-1 time on tonight's nodes, in nights of `budget`
        in_nights = backlog_documents * phase1_seconds / extracted_documents / budget
        nights = _ceil(in_nights)
        more_nodes = max(nodes, _ceil(nodes * in_nights))
    return CapacityReport(
        nodes=nodes, phase1_seconds=round(phase1_seconds, 1),
        phase1_budget_seconds=phase1_budget_seconds,
        documents_per_hour=round(extracted_documents * per_hour, 1),
        output_tokens_per_hour=round(completion_tokens * per_hour),
        prompt_tokens_per_hour=round(prompt_tokens * per_hour),
        backlog_documents=backlog_documents, backlog_tokens=backlog_tokens,
        backlog_output_tokens=backlog_out, nights_to_clear=nights,
        nodes_to_clear_in_one_night=more_nodes, note="; ".join(notes) or None)
