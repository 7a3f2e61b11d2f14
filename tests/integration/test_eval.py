"""`slm-nightly eval extraction` end to end on tests/fakes/eval_server.py: the real CLI, phase 1's
own code, the fixture gold (tests/fixtures/eval-gold.jsonl), and the baseline gate. No
llama-server: every run is given --base-url."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.eval_server import FakeEvalOpenAI
from tests.support.paths import ROOT
from tests.support.profiles import toml_profile

GOLD = ROOT / "tests" / "fixtures" / "eval-gold.jsonl"
CLI = str(Path(sys.executable).parent / "slm-nightly")


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, FakeEvalOpenAI]]:
    with FakeEvalOpenAI(GOLD, "gold") as gold, FakeEvalOpenAI(GOLD, "noise") as noise:
        yield {"gold": gold, "noise": noise}


def _profile(tmp: Path, model: str = "fake") -> Path:
    return toml_profile(tmp / f"{model}.toml", state_dir=tmp / "state",
                        compute={"type": "local"},
                        inference={"dialect": "vllm", "model": model,
                                   "max_concurrent_requests": 4, "request_timeout_seconds": 10,
                                   "max_retries": 1, "retry_base_seconds": 0.01,
                                   "context_tokens": 4096, "max_output_tokens": 512,
                                   "max_entities": 24, "max_relationships": 24})


def _eval(profile: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, "eval", "extraction", "--profile", str(profile), "--base-url",
                           url, "--gold", str(GOLD), *args], capture_output=True, text=True,
                          timeout=180, cwd=ROOT)


def _run(tmp: Path, fake: FakeEvalOpenAI, split: str = "all", *args: str,
         out: Path | None = None) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    out = out or tmp / f"{fake.mode}-{split}.json"
    proc = _eval(_profile(tmp), fake.url, "--split", split, "--out", str(out), *args)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc


def test_the_gold_answers_score_one(tmp_path: Path, fakes: dict[str, FakeEvalOpenAI]) -> None:
    result, proc = _run(tmp_path, fakes["gold"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    f = result["figures"]
    for prf in (f["entities"]["type_agnostic"], f["entities"]["type_strict"],
                f["relationships"]):
        assert (prf["precision"], prf["recall"], prf["f1"]) == (1.0, 1.0, 1.0)
    assert f["entities"]["type_strict"]["gold"] == 10 and f["relationships"]["gold"] == 5
    assert f["grounded"] == {"precision": 1.0, "grounded": 10, "ungrounded": 0}
    assert (f["resolution"]["over_split"], f["resolution"]["over_merge"]) == (0, 0)
    assert result["unusable_answers"] == {"total": 0, "by_reason": {}}
    assert result["failed"] == []
    assert set(result["splits"]) == {"train", "validation", "examples"}
    assert result["model"] == "fake" and result["split"] == "all"
    assert result["engine"]["base_url"] == fakes["gold"].url
    assert not result["engine"]["started_here"]
    assert len(result["schema"]["digest"]) >= 8 and len(result["prompt_digest"]) >= 8
    assert result["gleanings"] == 0 and result["gold"]["cases"] == 4
    # the terminal: one line per case, then the table
    assert proc.stdout.count("case ") >= 4 and "entities, type-strict" in proc.stdout
    assert "relationship triples" in proc.stdout and "grounded precision" in proc.stdout


def test_the_noise_answers_score_the_hand_computed_figures(
        tmp_path: Path, fakes: dict[str, FakeEvalOpenAI]) -> None:
    result, _ = _run(tmp_path, fakes["noise"])
    f = result["figures"]
    # Per case the noise answers 2 entities and 1 triple: an invented Topic (wrong, not in
    # the text) and the first gold entity with a wrong type (right by name only).
    # Type-agnostic: precision on the 3 complete cases, 3 right of 6 = 0.5; recall over the 4
    # cases, 4 found of 10 gold (3+2+3+2) = 0.4; F1 = 2·0.5·0.4/0.9 = 4/9.
    agn = f["entities"]["type_agnostic"]
    assert (agn["correct"], agn["predictions"], agn["found"], agn["gold"]) == (3, 6, 4, 10)
    assert (agn["precision"], agn["recall"]) == (0.5, 0.4)
    assert agn["f1"] == pytest.approx(4 / 9, abs=1e-12)
    # Type-strict: 0 of 6, 0 of 10 → P = R = F1 = 0.
    strict = f["entities"]["type_strict"]
    assert (strict["precision"], strict["recall"], strict["f1"]) == (0.0, 0.0, 0.0)
    # Triples: 0 of the 3 in complete cases right, 0 of 5 gold found.
    rel = f["relationships"]
    assert (rel["predictions"], rel["gold"], rel["precision"], rel["recall"], rel["f1"]) == \
        (3, 5, 0.0, 0.0, 0.0)
    # Grounded: 2 names a case, 1 in the text → 4 of 8 = 0.5.
    assert f["grounded"] == {"precision": 0.5, "grounded": 4, "ungrounded": 4}
    assert (f["resolution"]["over_split"], f["resolution"]["over_merge"]) == (0, 0)
    # split validation alone: 1 complete case (1 of 2 right), gold 3 + 2 of which 2 found
    v = result["splits"]["validation"]["entities"]["type_agnostic"]
    assert (v["precision"], v["recall"]) == (0.5, 0.4)


def test_the_gate(tmp_path: Path, fakes: dict[str, FakeEvalOpenAI]) -> None:
    baseline = tmp_path / "baseline.json"
    _run(tmp_path, fakes["gold"], "validation", out=baseline)
    result, proc = _run(tmp_path, fakes["noise"], "validation", "--baseline", str(baseline))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for figure, change in (("entity F1 (type-strict)", "1.000 → 0.000"),
                           ("entity recall (type-strict)", "1.000 → 0.000"),
                           ("relationship F1", "1.000 → 0.000"),
                           ("relationship recall", "1.000 → 0.000"),
                           ("grounded precision", "1.000 → 0.500")):
        assert re.search(rf"{re.escape(figure)}\s+{change} .*DROPPED", proc.stdout), proc.stdout
        assert f"{figure} {change}" in proc.stderr, proc.stderr
    assert "tolerance 0.020" in proc.stdout and "tolerance 0.020" in proc.stderr
    # the same answers as their own baseline pass; so does the noise within a wide tolerance
    noise = tmp_path / "noise-baseline.json"
    _run(tmp_path, fakes["noise"], "validation", out=noise)
    _, same = _run(tmp_path, fakes["noise"], "validation", "--baseline", str(noise))
    assert same.returncode == 0 and "gate passed" in same.stdout, same.stdout + same.stderr
    _, wide = _run(tmp_path, fakes["noise"], "validation", "--baseline", str(baseline),
                   "--tolerance", "1.0")
    assert wide.returncode == 0, wide.stdout + wide.stderr


def test_a_baseline_of_another_model_or_split_is_refused(
        tmp_path: Path, fakes: dict[str, FakeEvalOpenAI]) -> None:
    baseline = tmp_path / "baseline.json"
    _run(tmp_path, fakes["gold"], "validation", out=baseline)
    other = _eval(_profile(tmp_path, "other-model"), fakes["gold"].url, "--split", "validation",
                  "--baseline", str(baseline))
    assert other.returncode == 2
    assert "model 'fake', this run of model 'other-model'" in other.stderr, other.stderr
    split = _eval(_profile(tmp_path), fakes["gold"].url, "--split", "train", "--baseline",
                  str(baseline))
    assert split.returncode == 2 and "split 'validation'" in split.stderr, split.stderr
    assert not fakes["gold"].requests or all("other-model" not in json.dumps(r)
                                             for r in fakes["gold"].requests)
