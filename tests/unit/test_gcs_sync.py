"""Which bucket SLM_YOYO_WEIGHTS_GCS_BUCKET names (the emulator tests: integration/
test_artifact_store_gcs.py)."""

import pytest

from tasks.shared.errors import ConfigError
from tasks.shared.gcs_sync import ENV_BUCKET, env_bucket, parse_bucket_url


@pytest.mark.parametrize(("value", "expected"), [
    ("slm-weights", ("slm-weights", "")),
    ("gs://slm-weights", ("slm-weights", "")),
    ("gs://slm-weights/", ("slm-weights", "")),
    ("slm-weights/nightly", ("slm-weights", "nightly")),
    ("gs://slm-weights/nightly/a/", ("slm-weights", "nightly/a")),
    (" gs://my.bucket_1/x ", ("my.bucket_1", "x")),
])
def test_a_bucket_with_or_without_gs_and_a_folder(value: str, expected: tuple[str, str]) -> None:
    assert parse_bucket_url(value) == expected


@pytest.mark.parametrize("value", ["gs://", "gs:///nightly", "Slm-Weights", "ab", "gs:/x/y"])
def test_what_is_no_bucket_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match=f"{ENV_BUCKET}=.*not a GCS bucket — use the bucket's "
                                          "name, optionally with gs://"):
        parse_bucket_url(value)


def test_the_variable_becomes_a_gs_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_BUCKET, raising=False)
    assert env_bucket() is None
    monkeypatch.setenv(ENV_BUCKET, "  ")
    assert env_bucket() is None
    monkeypatch.setenv(ENV_BUCKET, "slm-weights/nightly/")
    assert env_bucket() == "gs://slm-weights/nightly"
    monkeypatch.setenv(ENV_BUCKET, "gs://slm-weights")
    assert env_bucket() == "gs://slm-weights"
