"""Where things are, for every test: the repository root, the fixtures, this environment's
`prefect` executable, the project's modules."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
PREFECT = str(Path(sys.executable).parent / "prefect")


def project_modules() -> dict[str, Path]:
    """Every module of blocks/, tasks/ and flows/ by its dotted name (a package by its
    __init__.py), sorted."""
    found = {}
    for top in ("blocks", "tasks", "flows"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found
