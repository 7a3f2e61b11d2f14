"""The shared test-profile writer (tests/support/profiles.py toml_profile) writes what it is given."""

import tomllib
from pathlib import Path

from tests.support.profiles import toml_profile


def test_tables_nested_tables_and_quoting(tmp_path: Path) -> None:
    odd = tmp_path / 'dir "with" quotes\\and slashes'
    path = toml_profile(tmp_path / "p.toml", state_dir=odd, skip=None,
                        compute={"type": "local", "n_threads": 2},
                        inference={"max_retries": 1, "retry_base_seconds": 0.01, "on": True,
                                   "tags": ["a", "b"], "gone": None,
                                   "extra": {"deep": "yes"}})
    assert tomllib.loads(path.read_text()) == {
        "state_dir": str(odd),
        "compute": {"type": "local", "n_threads": 2},
        "inference": {"max_retries": 1, "retry_base_seconds": 0.01, "on": True,
                      "tags": ["a", "b"], "extra": {"deep": "yes"}}}


def test_a_written_profile_loads(tmp_path: Path) -> None:
    from tasks.profile import load_profile

    src = tmp_path / "docs"
    for stream in ("transcripts", "research", "contacts"):
        (src / stream).mkdir(parents=True)
    path = toml_profile(tmp_path / "p.toml", state_dir=tmp_path / "state",
                        compute={"type": "local"},
                        inference={"model": "fake", "max_retries": 1},
                        sources={s: src / s for s in ("transcripts", "research", "contacts")})
    p = load_profile(str(path))
    assert (p.inference.model, p.inference.max_retries) == ("fake", 1)
