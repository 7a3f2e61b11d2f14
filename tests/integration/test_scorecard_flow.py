"""The scorecard flow (a real Prefect test server) and the `slm-nightly scorecard` CLI."""

import json
from pathlib import Path

import polars as pl
import pytest

from tests.support.corpus import APP, ENG, a, dpo, q, sft, write
from tests.support.profiles import toml_profile


@pytest.mark.usefixtures("prefect_api")
def test_scorecard_flow_writes_card_dataset_and_marker_for_passing_buckets_only(
        tmp_path: Path) -> None:
    from flows.scorecard import scorecard

    corpus = tmp_path / "corpus"
    write(corpus / ENG / "a.jsonl", [sft(q(i), a(i)) for i in range(40)])
    write(corpus / APP / "b.jsonl", [dpo(q(i), a(i), "No idea.") for i in range(5)])
    profile = toml_profile(tmp_path / "p.toml", state_dir=tmp_path / "state",
                           corpus={"root": corpus, "floor": 30, "min_tokens": 3,
                                   "max_source_share": 1.0})
    out = scorecard(profile=str(profile))
    assert out.training_pending == [ENG]
    assert out.buckets[APP].reasons == ["5 clean pairs < floor 30"]
    card = json.loads(Path(out.scorecard).read_text())
    assert card["version"] == 1 and card["floor"] == 30
    marker = json.loads((tmp_path / "state" / "training-pending" / f"{ENG}.json").read_text())
    assert marker["clean"] == 40 and marker["corpus_digest"] == card["buckets"][0]["digest"]
    data = pl.read_parquet(marker["dataset"])
    assert data.height == 40 and set(data["split"]) <= {"train", "eval"}
    assert not (tmp_path / "state" / "training-pending" / f"{APP}.json").exists()


def test_cli_prints_the_card_and_exits_by_verdict(tmp_path: Path, capsys) -> None:
    from flows.cli import main

    write(tmp_path / ENG / "a.jsonl", [sft(q(i), a(i)) for i in range(5)])
    (tmp_path / APP).mkdir()
    assert main(["scorecard", "--corpus", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "floor 3000 clean pairs" in out and "5 clean pairs < floor 3000" in out
    assert main(["scorecard", "--corpus", str(tmp_path), "--floor", "0", "--json"]) == 1
    card = json.loads(capsys.readouterr().out)
    assert card["floor"] == 0 and card["buckets"][1]["reasons"] == [
        "0 distinct sources < minimum 1"]
    assert main(["scorecard", "--corpus", str(tmp_path / "nope")]) == 2
    assert "nope/engineering-pointsav does not exist" in capsys.readouterr().err
