import shutil
from pathlib import Path

import pytest

from tasks.shared.gcs_sync import sync_folder
from tests.fakes.gcs import GcsEmulator
from tests.support.profiles import toml_profile


def test_sync_uploads_new_and_changed_files_only(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "engineering-pointsav").mkdir(parents=True)
    (corpus / "engineering-pointsav" / "a.jsonl").write_text('{"messages": []}\n')
    (corpus / "apprenticeship-pointsav").mkdir()
    (corpus / "apprenticeship-pointsav" / "b.jsonl.gz").write_bytes(b"\x1f\x8b binary")
    (corpus / ".cache").mkdir()
    (corpus / ".cache" / "x").write_text("skip")
    with GcsEmulator(tmp_path) as gcs:
        bucket = gcs.bucket(folder="nightly")
        first = sync_folder(corpus, bucket)
        assert first.model_dump() == {"bucket": "slm-corpus", "prefix": "nightly/corpus",
                                      "uploaded": 2, "unchanged": 0, "error": None}
        again = sync_folder(corpus, bucket)
        assert (again.uploaded, again.unchanged) == (0, 2)
        (corpus / "engineering-pointsav" / "a.jsonl").write_text('{"messages": [1]}\n')
        (corpus / "engineering-pointsav" / "c.jsonl").write_text("{}\n")
        third = sync_folder(corpus, bucket)
        assert (third.uploaded, third.unchanged) == (2, 1)
        names = sorted(b.name for b in bucket.list_blobs("corpus"))
        assert names == ["nightly/corpus/apprenticeship-pointsav/b.jsonl.gz",
                         "nightly/corpus/engineering-pointsav/a.jsonl",
                         "nightly/corpus/engineering-pointsav/c.jsonl"]
        got = tmp_path / "got.jsonl"
        bucket.download_object_to_path("corpus/engineering-pointsav/a.jsonl", got)
        assert got.read_text() == '{"messages": [1]}\n'
        missing = sync_folder(corpus, gcs.bucket(name="no-such-bucket"))
    assert missing.error is not None and missing.uploaded == 0
    assert (corpus / "engineering-pointsav" / "a.jsonl").exists()  # local corpus untouched


@pytest.mark.usefixtures("prefect_api")
def test_scorecard_flow_syncs_through_a_saved_gcs_bucket_block(tmp_path: Path) -> None:
    from flows.scorecard import scorecard

    corpus = tmp_path / "corpus"
    shutil.copytree(Path(__file__).parents[2] / "examples" / "corpus", corpus)
    profile = toml_profile(tmp_path / "p.toml", state_dir=tmp_path / "state",
                           corpus={"root": corpus, "floor": 200, "gcs_block": "test-corpus"})
    with GcsEmulator(tmp_path) as gcs:
        gcs.bucket().save("test-corpus", overwrite=True)
        out = scorecard(profile=str(profile))
        assert out.gcs_sync is not None and out.gcs_sync.error is None
        assert out.gcs_sync.uploaded == len([p for p in corpus.rglob("*") if p.is_file()])
        again = scorecard(profile=str(profile))
        assert again.gcs_sync is not None and again.gcs_sync.uploaded == 0
