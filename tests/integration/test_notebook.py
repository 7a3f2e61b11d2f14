"""notebooks/debug_document.ipynb, executed for real against the local llama.cpp server."""

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from tests.support.paths import ROOT


def test_debug_notebook_runs_end_to_end(tmp_path: Path, monkeypatch) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text((ROOT / "profiles" / "local.toml").read_text()
                       .replace('state_dir = ".slm-nightly"', f'state_dir = "{tmp_path / "s"}"')
                       .replace('data_dir = ".slm-nightly/graph"',
                                f'data_dir = "{tmp_path / "graph"}"'))
    monkeypatch.setenv("SLM_PROFILE", str(profile))
    monkeypatch.setenv("SLM_DOCUMENT", "examples/transcripts/education_1.md")
    monkeypatch.delenv("SLM_BASE_URL", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    nb = nbformat.read(ROOT / "notebooks" / "debug_document.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []))
    assert "transcripts/education_1.md" in text
    assert "Meeting education_1" in text  # the prompt
    assert "usage: {'calls': " in text
    assert "Person:kirsty williams" in text  # deterministic participant rows
    assert '"Person":' in text  # read back from the scratch graph
    assert not (tmp_path / "s" / "inference.pid.json").exists()  # server stopped
