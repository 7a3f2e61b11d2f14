"""Where things are, for every test: the repository root, the fixtures, this environment's
`prefect` executable."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
PREFECT = str(Path(sys.executable).parent / "prefect")
