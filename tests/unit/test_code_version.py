"""tasks/shared/code_version.py: the version names the files push_to_gcs uploads, and only those."""

from pathlib import Path

import pytest

from tasks.shared.code_version import code_files, code_folder, code_version
from tests.support.paths import ROOT


def test_the_files_are_what_prefectignore_lets_through() -> None:
    from prefect.utilities.filesystem import filter_files

    patterns = (ROOT / ".prefectignore").read_text().splitlines()
    theirs = sorted(filter_files(str(ROOT), patterns, include_dirs=False, as_posix=True))
    assert code_files(ROOT) == theirs  # push_to_gcs's own filter, walked without pruning
    assert "flows/train.py" in theirs and "profiles/gcp.toml" in theirs
    assert not [f for f in theirs if f.startswith(("tests/", ".venv/", "docs/", ".git/"))]


def test_no_ignore_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"\.prefectignore: missing — the node's code is "
                       r"what this file lets through \(deploy from the project's checkout\)"):
        code_files(tmp_path)


def checkout(root: Path) -> Path:
    """A small checkout: the project's .prefectignore, code, configuration and what it keeps
    out (a venv, tests, docs, state)."""
    (root / ".prefectignore").parent.mkdir(parents=True, exist_ok=True)
    (root / ".prefectignore").write_text((ROOT / ".prefectignore").read_text())
    for rel in ("flows/train.py", "tasks/__init__.py", "tasks/compute/gce.py",
                "blocks/gce.py", "profiles/gcp.toml", "recipes/production.yaml",
                "prefect.yaml", "pyproject.toml", "tasks/__pycache__/gce.cpython-311.pyc",
                ".venv/lib/x.py", "tests/t.py", "docs/d.md", ".slm-nightly/runs/r.json",
                "README.md"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"{rel}\n")
    return root


def test_a_checkout_pushes_its_code_and_configuration_only(tmp_path: Path) -> None:
    assert code_files(checkout(tmp_path)) == [
        ".prefectignore", "blocks/gce.py", "flows/train.py", "prefect.yaml", "profiles/gcp.toml",
        "pyproject.toml", "recipes/production.yaml", "tasks/__init__.py",
        "tasks/compute/gce.py"]


@pytest.mark.parametrize("rel", ["tasks/compute/gce.py", "profiles/gcp.toml", "prefect.yaml"])
def test_a_changed_file_is_a_new_version(tmp_path: Path, rel: str) -> None:
    orch = checkout(tmp_path / "c")
    before = code_version(orch)
    for ignored in (".venv/lib/x.py", "tests/t.py", "docs/d.md", "README.md"):
        (orch / ignored).write_text("changed\n")
    assert code_version(orch) == before  # ignored files change nothing
    with open(orch / rel, "a") as f:
        f.write("\n# changed\n")
    after = code_version(orch)
    assert after != before and len(after) == 16
    (orch / rel).rename(orch / (rel + ".moved"))  # a path is part of the version too
    assert code_version(orch) not in (before, after)


def test_the_folder_of_a_version() -> None:
    assert code_folder("/slm/", "0123456789abcdef") == "slm/code/0123456789abcdef"
    assert code_folder("a/b", "v") == "a/b/code/v"
    assert code_folder(None, "v") == code_folder("", "v") == "code/v"
    assert code_folder("XY/", "v") == "XY/code/v"


def test_the_version_format(tmp_path: Path) -> None:
    import hashlib

    (tmp_path / ".prefectignore").write_text("/*\n!/.prefectignore\n!/flows/\n")
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "a.py").write_text("a\n")
    h = hashlib.sha256()
    for rel, data in ((".prefectignore", b"/*\n!/.prefectignore\n!/flows/\n"),
                      ("flows/a.py", b"a\n")):
        h.update(rel.encode() + b"\0" + b"")
        h.update(hashlib.sha256(data).digest())
    assert code_version(tmp_path) == h.hexdigest()[:16]
    assert code_version(str(tmp_path)) == code_version(tmp_path)


def test_without_a_folder_the_version_is_the_working_directorys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    orch = checkout(tmp_path / "c")
    monkeypatch.chdir(orch)
    assert code_version() == code_version(orch)
