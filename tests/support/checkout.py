"""A copy of this checkout, as an orchestrator's would be."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tasks.gcp.code import checkout_files
from tests.support.paths import ROOT


def orchestrator_checkout(dest: Path) -> Path:
    """A checkout of this repository's files as they are now (tracked, and new files git does
    not ignore), without its .venv, state or caches; a git repository with nothing committed,
    so git lists the same files in it (tasks/gcp/code.py packs what git lists)."""
    for rel in checkout_files(ROOT):  # what `gcp orchestrator` packs (tasks/gcp/code.py)
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    subprocess.run(["git", "init", "-q", str(dest)], check=True)
    return dest
