"""What issue 40's refactor must not break for the people already running the pipeline: a run
summary the last release wrote, the deployments' saved parameters, and the profiles (their
keys, and phase 1's setup read from them)."""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import yaml

from tasks.profile import load_profile, profile_in_use
from tasks.records import RunSummary
from tests.support.paths import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "records"


def test_the_summary_make_run_wrote_before_the_refactor_loads_and_writes_back_the_same() -> None:
    # `make clean-state; make run` on 3be6fc9 (2026-12-04), before issue 40's control changes
    path = FIXTURES / "make-run-2026-12-04.json"
    old = json.loads(path.read_text(encoding="utf-8"))
    s = RunSummary.load(path)
    assert (s.profile, s.status, list(s.phases)[:3]) == (
        "local", "completed", ["compute_up", "inference_up", "extract"])
    assert s.extraction is not None and s.extraction.llm_calls == 19
    assert json.loads(s.to_json()) == old


def test_every_deployments_saved_parameters_are_its_flows_parameters() -> None:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text(encoding="utf-8"))
    checked = []
    for d in spec["deployments"]:
        module, _, name = d["entrypoint"].partition(":")
        fn = getattr(importlib.import_module(module.removesuffix(".py").replace("/", ".")), name)
        params = d.get("parameters") or {}
        inspect.signature(fn.fn).bind_partial(**params)  # TypeError on a name it lacks
        required = [p.name for p in inspect.signature(fn.fn).parameters.values()
                    if p.default is inspect.Parameter.empty and p.name not in params]
        if not required:  # (train/node gets its params when the nightly runs it)
            fn.validate_parameters(params)  # ParameterTypeError on a value of the wrong type
        checked.append(f"{name}/{d['name']}")
    assert len(checked) == len(spec["deployments"]) and "nightly/production" in checked


def test_phase_1_reads_its_setup_from_the_local_profile_once() -> None:
    cfg = load_profile("local")
    setup = cfg.phase1("local")
    assert setup.profile == "local" and setup.endpoint is cfg.inference
    assert sorted(setup.roots) == ["contacts", "research", "transcripts"]
    assert all(root.is_dir() for root in setup.roots.values())
    assert (setup.max_bytes, setup.batch_documents, setup.max_failed_share) == (
        int(cfg.sources.max_document_mb * 1e6), cfg.extraction.batch_documents,
        cfg.extraction.max_failed_share)
    assert cfg.phase1("local", max_failed_share=0.5).max_failed_share == 0.5
    assert setup.ask.model == cfg.inference.model
    assert setup.ask.gleanings == cfg.extraction.gleanings
    assert setup.dead_letter == cfg.state_dir / "dead-letter.jsonl"
    assert setup.snapshots.keep == cfg.graph.snapshots_to_keep()
    with profile_in_use("local", cfg):  # a night's subflows get the night's own profile
        assert load_profile("local") is cfg
    assert load_profile("local") is not cfg  # after the night: read again


def test_a_profile_path_in_use_is_its_own_reference(tmp_path: Path) -> None:
    copy = tmp_path / "mine.toml"
    copy.write_text((ROOT / "profiles" / "local.toml").read_text(encoding="utf-8"))
    cfg = load_profile(str(copy))
    with profile_in_use(str(copy), cfg):
        assert load_profile(str(copy)) is cfg
        assert load_profile("local") is not cfg
