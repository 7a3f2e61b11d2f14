"""Where the project is on this machine: the folder that holds profiles/, pyproject.toml and
recipes/, found from this file rather than the working directory.

A leaf of its own because the composition root (tasks/profile.py) and the modules below it
(tasks/shared/environment.py, tasks/engine/llama_build.py) all resolve paths from it.
"""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
