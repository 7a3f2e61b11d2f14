"""Both tiers: Prefect's settings for a local run, applied before Prefect is imported, the
shipped profile defaults, and the fake OpenAI-compatible server."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from tasks.runtime import prefect_env

# Each test process (an xdist worker, or a second checkout testing at once) has a PREFECT_HOME of
# its own, set before Prefect is imported: Prefect's files and the project's slot records
# (tasks/slots.py, under PREFECT_HOME) are never another process's, nor the user's ~/.prefect.
_HOME = tempfile.mkdtemp(prefix=f"slm-tests-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ["PREFECT_HOME"] = os.path.join(_HOME, "prefect")
prefect_env.apply()
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# An orchestrator exports SLM_NIGHTLY_PROFILE=gcp (docs/operator-gcp.md): the tests that call
# the CLI without --profile expect the shipped defaults.
os.environ.pop("SLM_NIGHTLY_PROFILE", None)

from tests.fakes.openai_server import FakeOpenAI  # noqa: E402


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(slow_seconds=2.0) as f:
        yield f
