"""Both tiers: Prefect's settings for a local run, applied before Prefect is imported, the
shipped profile defaults, and the fake OpenAI-compatible server."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tasks.runtime import prefect_env

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
