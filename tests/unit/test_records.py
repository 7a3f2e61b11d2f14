"""The typed records (tasks/records/): the job state machine, round trips, files written by
the code before the records (tests/fixtures/records/: real files from `make run`, and one
failed run written by hand in the same shape), unknown versions and misspelled keys.

The .txt/.md fixtures are the summaries as the dict-based renderer printed them before the
records existed: the same `make run` text must come out of the models."""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path
from typing import Any

import pytest

from tasks.night.summary import cost_summary, new_summary, render_markdown, render_text
from tasks.records import (
    STATES,
    AdapterManifest,
    ExtractionReport,
    NodeUsage,
    RunSummary,
    Scorecard,
    ScorecardSummary,
    TrainingMarker,
    TrainingResult,
    UnlinkedMention,
)
from tasks.shared.errors import IllegalTransition, RecordError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records"

LEGAL = {("queued", "starting"), ("starting", "preparing"), ("preparing", "running"),
         ("running", "done")} | {(s, end) for s in ("queued", "starting", "preparing", "running")
                                 for end in ("failed", "cancelled")}


def _fixture(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / name).read_text()))


def _manifest(state: str = "queued") -> AdapterManifest:
    data = _fixture("manifest.json")
    data.pop("version")
    return AdapterManifest.model_validate({**data, "schema_version": 1, "state": state})


# --- the job's state machine ---------------------------------------------------------------

def test_the_states_are_the_documented_seven() -> None:
    assert STATES == ("queued", "starting", "preparing", "running", "done", "failed",
                      "cancelled")


@pytest.mark.parametrize(("old", "new"), sorted(LEGAL))
def test_every_legal_transition_moves_the_job(old: str, new: str) -> None:
    m = _manifest(old)
    m.advance(new)  # type: ignore[arg-type]
    assert m.state == new


@pytest.mark.parametrize(("old", "new"), sorted(
    (a, b) for a, b in product(STATES, STATES) if a != b and (a, b) not in LEGAL))
def test_every_other_transition_is_refused_and_leaves_the_state(old: str, new: str) -> None:
    m = _manifest(old)
    with pytest.raises(IllegalTransition, match=f"job state {old} → {new} is not a legal"):
        m.state = new  # type: ignore[assignment]
    assert m.state == old


def test_the_refusal_names_the_adapter_and_what_is_allowed() -> None:
    m = _manifest("queued")
    with pytest.raises(IllegalTransition) as e:
        m.advance("running")
    assert str(e.value) == ("adapter engineering-pointsav-20261130T171539-b1cc2b96: job state "
                            "queued → running is not a legal transition (from queued: "
                            "cancelled, failed, starting)")
    m = _manifest("done")
    with pytest.raises(IllegalTransition) as e:
        m.advance("failed")
    assert str(e.value).endswith("job state done → failed is not a legal transition (from "
                                 "done: none: it is final)")


def test_advance_sets_the_other_fields_with_the_state() -> None:
    m = _manifest("running")
    m.advance("done", finished="2026-11-30T17:17:25+00:00", message="ok")
    assert (m.state, m.finished, m.message) == ("done", "2026-11-30T17:17:25+00:00", "ok")


def test_a_whole_job_walks_from_queued_to_done() -> None:
    m = _manifest("queued")
    for state in ("starting", "preparing", "running", "done"):
        m.advance(state)  # type: ignore[arg-type]
    assert m.state == "done"


# --- files written before the records (no schema_version) ----------------------------------

@pytest.mark.parametrize("name", ["last-run", "first-run", "failed-run"])
def test_an_old_run_summary_renders_the_same_text_as_before(name: str) -> None:
    s = RunSummary.load(FIXTURES / f"{name}.json")
    profile = "gce" if name == "failed-run" else "local"
    assert render_text(s, profile) + "\n" == (FIXTURES / f"{name}.txt").read_text()
    assert render_markdown(s) + "\n" == (FIXTURES / f"{name}.md").read_text()


def test_an_old_run_summary_loads_with_its_values() -> None:
    s = RunSummary.load(FIXTURES / "last-run.json")
    assert s.schema_version == 2
    assert (s.profile, s.status, s.node) == ("local", "completed", "local machine")
    assert s.extraction is not None and s.extraction.documents["transcripts"].skipped == 11
    assert s.phases["train:engineering-pointsav"].seconds == 1.13
    assert s.scorecard is not None and s.scorecard.buckets["apprenticeship-pointsav"].clean == 297
    assert s.training is not None
    assert s.training["engineering-pointsav"].gate == \
        "eval loss 3.6376 beats base 3.8111 by at least 0.0%"
    assert s.cost is not None and s.cost.note == "local machine: no cost"


def test_an_old_run_summary_written_again_keeps_its_keys_and_values() -> None:
    old = _fixture("last-run.json")
    new = json.loads(RunSummary.load(FIXTURES / "last-run.json").to_json())
    assert new.pop("schema_version") == 2
    new.update(new.pop("extraction"))  # version 2 holds phase 1's report whole
    for row in new["training"].values():
        assert row.pop("schema_version") == 1
    assert new == old


def test_the_empty_graph_block_of_an_old_summary_is_dropped() -> None:
    s = RunSummary.load(FIXTURES / "failed-run.json")
    assert s.extraction is not None and s.extraction.graph is None
    assert "graph" not in json.loads(s.to_json())["extraction"]


def test_an_old_manifest_loads_and_loses_its_old_version_number() -> None:
    m = AdapterManifest.load(FIXTURES / "manifest.json")
    assert (m.schema_version, m.state, m.step, m.steps) == (1, "done", 12, 12)
    assert m.base.gguf is not None and m.base.gguf.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert m.gate is not None and m.gate.eval_loss == {"base": 3.81111, "new": 3.63765}
    assert m.pairs is not None and (m.pairs.train, m.pairs.eval) == (282, 8)
    assert m.promotions[0].at == "2026-11-30T17:17:25+00:00"
    written = json.loads(m.to_json())
    assert "version" not in written
    old = _fixture("manifest.json")
    del old["version"]
    old["base"]["gguf_digest"] = None  # recorded since; unknown for an old manifest
    assert {k: written[k] for k in old} == old
    assert set(written) - set(old) == {"schema_version", "reused", "owner"}


def test_an_old_scorecard_and_marker_load() -> None:
    card = Scorecard.load(FIXTURES / "scorecard.json")
    assert (card.version, card.floor, [b.bucket for b in card.buckets]) == (
        1, 200, ["engineering-pointsav", "apprenticeship-pointsav"])
    assert card.buckets[1].rules["secrets_pii"] == 1
    assert json.loads(card.to_json()) == {**_fixture("scorecard.json"), "schema_version": 1}
    marker = TrainingMarker.load(FIXTURES / "training-pending.json")
    assert (marker.bucket, marker.kind, marker.clean) == ("engineering-pointsav", "sft", 300)
    assert json.loads(marker.to_json()) == {**_fixture("training-pending.json"),
                                            "schema_version": 1}


def test_an_old_node_result_row_parses() -> None:
    row = {"name": "a", "bucket": "b", "state": "done", "step": 4, "steps": 4, "loss": 0.7,
           "eval_loss": 0.68, "verified": None, "promoted": True, "peak_mib": 3608.7,
           "reused": False, "dataset": "/d.parquet", "flow_run_id": "f", "gate": "g",
           "node_run": {"id": "i", "name": "n"}}
    r = TrainingResult.parse(row, "node run n")
    assert r.node_run is not None and r.node_run.name == "n"
    assert r.to_dict() == {**row, "schema_version": 1}


# --- round trips ---------------------------------------------------------------------------

def test_each_record_round_trips_through_its_file(tmp_path: Path) -> None:
    records = [RunSummary.load(FIXTURES / "first-run.json"),
               AdapterManifest.load(FIXTURES / "manifest.json"),
               Scorecard.load(FIXTURES / "scorecard.json"),
               TrainingMarker.load(FIXTURES / "training-pending.json"),
               TrainingResult(state="not run", message="no time left")]
    for rec in records:
        path = rec.save(tmp_path / f"{type(rec).__name__}.json")
        again = type(rec).load(path)
        assert again == rec
        assert again.to_json() == path.read_text()


def test_a_new_summary_writes_only_what_its_phases_filled() -> None:
    s = new_summary("local")
    s.set_phase("compute_up", "completed", 0.5)
    s.set_phase("scorecard", "skipped", note="no [corpus] root in the profile")
    s.cost = cost_summary(None, s)
    assert s.to_dict() == {
        "schema_version": 2, "profile": "local", "status": "running",
        "phases": {"compute_up": {"status": "completed", "seconds": 0.5},
                   "scorecard": {"status": "skipped", "seconds": 0.0,
                                 "note": "no [corpus] root in the profile"}},
        "cost": {"tokens_in": 0, "tokens_out": 0, "gpu_hours": None, "estimated_usd": None,
                 "note": "node usage unavailable (see the run log)"}}


def test_the_serving_adapter_line_tells_not_started_from_base_model() -> None:
    s = new_summary("local")
    assert "Inference server adapter" not in render_text(s)
    s.serving_adapter = None  # started, with no promoted adapter
    assert "Inference server adapter: none (base model)" in render_text(s)
    again = RunSummary.parse(json.loads(s.to_json()), "test")
    assert "Inference server adapter: none (base model)" in render_text(again)


def test_merge_extraction_takes_over_the_phase_1_counts() -> None:
    s = new_summary("local")
    s.merge_extraction(None)  # a PhaseFailed raised before phase 1 counted anything
    assert s.extraction is None
    last = _fixture("last-run.json")
    report = {k: last[k] for k in ("documents", "llm_calls", "prompt_tokens",
                                   "completion_tokens", "entities", "relationships", "failures",
                                   "graph", "dead_letter", "deleted", "pruned",
                                   "rejected_entity_types", "remapped_relationship_types",
                                   "unusable_answers", "dropped_fields", "bad_records")}
    s.merge_extraction(ExtractionReport.model_validate(
        {**report, "llm_retries": 2, "dangling_relationships": 1, "seconds": 1.2}))
    x = s.extraction
    assert x is not None and x.documents["research"].seen == 6
    assert x.graph is not None and x.graph.nodes["Person"] == 164
    assert x.dead_letter == "/work/main/.slm-nightly/dead-letter.jsonl"


def test_the_summary_lists_the_names_linked_to_no_one() -> None:
    s = new_summary("local")
    assert "Resolution:" not in render_text(s)
    s.merge_extraction(ExtractionReport.empty().model_copy(update={
        "namesakes_linked": 3, "namesakes_apart": 2, "joins": {"surname": 1, "e-mail": 4},
        "unlinked_people": [UnlinkedMention(
            document="research/d.md", name="John Smith", relationships=2,
            candidates=["Person:john smith", "Person:john smith <js@n.example>"]),
            UnlinkedMention(document="research/e.md", name="Sam Lee", relationships=0,
                            candidates=["Person:sam lee", "Person:sam lee <s@l.example>"],
                            judge="Nothing tells them apart.")]}))
    again = RunSummary.parse(json.loads(s.to_json()), "test")
    want = ["Resolution: 5 joins (4 by e-mail, 1 by surname), 2 contacts kept apart from a "
            "namesake, 3 names alone linked by their document, 2 linked to none (their "
            "document fits several or none)",
            "  research/d.md: John Smith — one of Person:john smith, Person:john smith "
            "<js@n.example>; 2 facts not written",
            "  research/e.md: Sam Lee — one of Person:sam lee, Person:sam lee <s@l.example>; "
            "0 facts not written; the judge: Nothing tells them apart."]
    text = render_text(again).splitlines()
    assert text[text.index(want[0]):text.index(want[0]) + 3] == want
    assert f"{want[0]}.\n- {want[1].strip()}" in render_markdown(again)


def test_cost_summary_of_a_gce_node() -> None:
    s = new_summary("gce")
    s.extraction = ExtractionReport.empty()
    s.extraction.prompt_tokens, s.extraction.completion_tokens = 10, 20
    usage = {"gpu_hours": 0.5, "running_seconds": 1800.0, "estimated_usd": 0.35,
             "zones": {"us-central1-a": {"running_seconds": 1800.0, "provisioning": "spot",
                                         "usd_per_hour": 0.7, "estimated_usd": 0.35,
                                         "status": "TERMINATED"}}}
    s.cost = cost_summary(NodeUsage.model_validate(usage), s)
    assert "Cost: 0.5000 GPU-hours at spot $0.70/h ≈ $0.3500; tokens in 10 / out 20" in \
        render_text(s)


# --- what must fail ------------------------------------------------------------------------

@pytest.mark.parametrize(("cls", "fixture"), [
    (RunSummary, "last-run.json"), (AdapterManifest, "manifest.json"),
    (Scorecard, "scorecard.json"), (TrainingMarker, "training-pending.json")])
def test_a_future_version_is_refused_naming_the_file_and_both_versions(
        tmp_path: Path, cls: type[Any], fixture: str) -> None:
    path = tmp_path / fixture
    future = cls.SCHEMA_VERSION + 1
    path.write_text(json.dumps({**_fixture(fixture), "schema_version": future}))
    with pytest.raises(RecordError) as e:
        cls.load(path)
    assert str(e.value) == (
        f"{path}: {cls.__name__} schema_version {future} found, version {cls.SCHEMA_VERSION} "
        "expected (files without a "
        "schema_version are read as today's shape) — written by another version of "
        "slm-nightly: run that version, or move the file away")


def test_a_future_version_inside_a_summary_is_refused_too() -> None:
    data = _fixture("last-run.json")
    data["training"]["engineering-pointsav"]["schema_version"] = 3
    with pytest.raises(RecordError, match="^last-run: TrainingResult schema_version 3 found, "
                                          "version 1 expected"):
        RunSummary.parse(data, "last-run")


def test_a_node_result_from_a_newer_node_is_refused() -> None:
    with pytest.raises(RecordError, match="^train:b: the result of node run n: TrainingResult "
                                          "schema_version 2 found, version 1 expected"):
        TrainingResult.parse({"schema_version": 2, "state": "done"},
                             "train:b: the result of node run n")


@pytest.mark.parametrize(("cls", "fixture", "key"), [
    (RunSummary, "last-run.json", "llm_call"), (AdapterManifest, "manifest.json", "eval_los"),
    (Scorecard, "scorecard.json", "flor"), (TrainingMarker, "training-pending.json", "datset")])
def test_a_misspelled_key_in_a_file_fails_naming_it(tmp_path: Path, cls: type[Any],
                                                     fixture: str, key: str) -> None:
    path = tmp_path / fixture
    path.write_text(json.dumps({**_fixture(fixture), key: 1}))
    with pytest.raises(RecordError) as e:
        cls.load(path)
    assert str(e.value).splitlines()[:2] == [
        f"{path}: not a valid {cls.__name__} (schema_version {cls.SCHEMA_VERSION}):",
        f"  - {key}: Extra inputs are not permitted (got 1)"]


def test_a_misspelled_field_in_code_fails_where_it_is_written() -> None:
    s = new_summary("local")
    with pytest.raises(ValueError, match="serving_adaptor"):
        s.serving_adaptor = "x"  # type: ignore[attr-defined]
    m = _manifest("running")
    with pytest.raises(ValueError, match="eval_los"):
        m.eval_los = 1.0  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="Input should be 'running', 'completed'"):
        s.set_phase("extract", "complete")  # type: ignore[arg-type]


def test_a_misspelled_key_from_the_scorecard_flow_fails() -> None:
    with pytest.raises(ValueError, match="training_pendin"):
        ScorecardSummary.model_validate({"floor": 1, "buckets": {}, "scorecard": "x",
                                         "training_pendin": []})


def test_a_file_that_is_not_json_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "last-run.json"
    path.write_text('{"profile": ')
    with pytest.raises(RecordError, match=f"^{path}: not JSON"):
        RunSummary.load(path)


# --- the failure rows ----------------------------------------------------------------------

def test_a_failure_row_has_the_keys_it_was_given_in_every_dump(tmp_path: Path) -> None:
    from tasks.extraction.batch import append_dead_letters, failure_record
    from tasks.extraction.documents import Document, LoadFailure
    load = failure_record(LoadFailure("transcripts/b.md", "transcripts", "/d/b.md", None,
                                      "not UTF-8"), "DocumentError",
                          "not UTF-8 — re-save the file as UTF-8")
    llm = failure_record(Document("transcripts/a.md", "transcripts", "/d/a.md", "h1", "text"),
                         "LLMError", "boom", 3, model="m", prompt_version="v1", held=True)
    bad = failure_record(Document("contacts/c.json", "contacts", "/d/c.json", "h2", ""),
                         "RecordError", "no name", id="contacts/c.json#1", record=1)
    assert (bad.id, bad.path, bad.hash, bad.attempts) == ("contacts/c.json#1", "/d/c.json", "h2", 0)
    base = ["id", "path", "stream", "hash", "error", "message", "attempts", "time"]
    assert list(load.model_dump()) == base
    assert list(llm.model_dump(mode="json")) == base + ["model", "prompt_version", "held"]
    assert list(bad.model_dump()) == base + ["record"]
    # nested in a report dumped whole (flows/extract.py publishes it so): still no nulls
    report = ExtractionReport.empty().model_copy(update={"failures": [load, bad]})
    assert [list(r) for r in report.model_dump(mode="json")["failures"]] == \
        [base, base + ["record"]]
    # the dead-letter file: the lines json.dumps wrote of the dict rows before the record
    path = tmp_path / "dl.jsonl"
    append_dead_letters(path, [load, llm])
    append_dead_letters(path, [])
    t = load.time
    assert path.read_text(encoding="utf-8").splitlines() == [
        '{"id": "transcripts/b.md", "path": "/d/b.md", "stream": "transcripts", "hash": null, '
        '"error": "DocumentError", "message": "not UTF-8 — re-save the file as UTF-8", '
        f'"attempts": 0, "time": "{t}"}}',
        '{"id": "transcripts/a.md", "path": "/d/a.md", "stream": "transcripts", "hash": "h1", '
        f'"error": "LLMError", "message": "boom", "attempts": 3, "time": "{llm.time}", '
        '"model": "m", "prompt_version": "v1", "held": true}']


def test_an_old_failure_row_loads_and_a_misspelled_key_in_one_is_refused() -> None:
    row = _fixture("last-run.json")["failures"][0]
    s = RunSummary.parse({**_fixture("last-run.json")}, "test")
    assert s.extraction is not None
    (f,) = s.extraction.failures
    assert (f.id, f.error, f.attempts, f.held) == ("transcripts/Bro003.md", "HeldAfterFailure",
                                                   0, None)
    with pytest.raises(RecordError, match="helld"):
        RunSummary.parse({**_fixture("last-run.json"), "failures": [{**row, "helld": True}]},
                         "test")


def test_a_failed_snapshot_and_a_corpus_sync_in_a_summary_load_and_render() -> None:
    from tasks.records import GraphSummary, SnapshotFailed, SyncReport

    g = GraphSummary.model_validate({"snapshot": {"error": "GraphError: BGSAVE failed"}})
    assert isinstance(g.snapshot, SnapshotFailed)
    assert g.model_dump()["snapshot"] == {"error": "GraphError: BGSAVE failed"}
    s = RunSummary.parse(_fixture("last-run.json"), "test")
    assert s.scorecard is not None and s.extraction is not None
    s.scorecard.gcs_sync = SyncReport.model_validate(
        {"bucket": "b", "prefix": "n/corpus", "uploaded": 2, "unchanged": 1, "error": None})
    assert "  GCS sync gs://b/n/corpus: 2 uploaded, 1 unchanged" in render_text(s).splitlines()
    s.scorecard.gcs_sync = SyncReport(bucket="b", prefix="n/corpus",
                                      error=SyncReport.failed(OSError("x" * 400)).error)
    s.extraction.graph = g
    text = render_text(s).splitlines()
    assert f"  GCS sync gs://b/n/corpus: FAILED (OSError: {'x' * 300}); local corpus kept" in text
    assert "  snapshot: NOT taken (GraphError: BGSAVE failed)" in text
