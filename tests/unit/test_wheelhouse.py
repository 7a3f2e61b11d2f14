"""tasks/engine/wheelhouse.py with the real pip against a local folder of wheels (PIP_FIND_LINKS,
PIP_NO_INDEX): downloaded once with its dependency, reused, nothing left by a failure."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tasks.engine import wheelhouse
from tasks.shared.errors import ConfigError


def _wheel(into: Path, name: str, version: str, requires: list[str]) -> Path:
    """A minimal pure-Python wheel (PEP 427): a module, METADATA, WHEEL, RECORD."""
    into.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    path = into / f"{name}-{version}-py3-none-any.whl"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{name}.py": "X = 1\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    links = tmp_path / "links"
    _wheel(links, "slmtoy", "1.0", ["slmdep==2.0"])
    _wheel(links, "slmdep", "2.0", [])
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    return links


def test_a_pinned_requirement_is_downloaded_once_with_its_dependencies(
        index: Path, tmp_path: Path) -> None:
    got = wheelhouse.ensure("slmtoy==1.0", tmp_path / "cache")
    assert got.parent == tmp_path / "cache" / "wheels" and got.name.startswith("slmtoy-1.0-cp")
    assert sorted(p.name for p in got.iterdir()) == ["slmdep-2.0-py3-none-any.whl",
                                                     "slmtoy-1.0-py3-none-any.whl"]
    for whl in index.iterdir():
        whl.unlink()  # the second call must not need the index
    assert wheelhouse.ensure("slmtoy==1.0", tmp_path / "cache") == got
    assert [p.name for p in (tmp_path / "cache" / "wheels").iterdir()
            if not p.name.endswith(".lock")] == [got.name]


def test_a_failed_download_leaves_nothing_and_says_why(index: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"`pip download slmtoy==9\.9` exited 1 — check the "
                                          "network or the pin"):
        wheelhouse.ensure("slmtoy==9.9", tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache" / "wheels").iterdir()] == [
        wheelhouse.folder("slmtoy==9.9", tmp_path / "cache").name + ".lock"]


@pytest.mark.parametrize("req", ["torch", "torch>=2", "torch==2.13.0; python_version>'3'"])
def test_an_unpinned_requirement_is_refused(req: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a pinned requirement .NAME==VERSION. — pin it"):
        wheelhouse.ensure(req, tmp_path)


def test_the_command_prints_the_folder(index: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLM_BUILD_CACHE", str(tmp_path / "cache"))
    assert wheelhouse.main(["slmtoy==1.0"]) == 0
    assert capsys.readouterr().out.strip() == str(wheelhouse.folder("slmtoy==1.0"))
    assert wheelhouse.main([]) == 2
    assert wheelhouse.main(["slmtoy==9.9"]) == 1
