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
# (tasks/shared/slots.py, under PREFECT_HOME) are never another process's, nor the user's ~/.prefect.
_HOME = tempfile.mkdtemp(prefix=f"slm-tests-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ["PREFECT_HOME"] = os.path.join(_HOME, "prefect")
prefect_env.apply()
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# Under xdist, each worker's share of the cores is its OpenMP thread count, inherited by every
# process it starts (training, conversion, flow runs): PyTorch's default of one thread per core
# in each of two workers on 2 cores spins threads against each other. Measured on 2 cores
# (test_train, test_olmo3 and test_quiet under -n 2, 2026-12-04): 268 s with 1 thread against
# 317 s with PyTorch's default. llama.cpp's threads are set per server (-t), not by this.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))
# An orchestrator exports SLM_NIGHTLY_PROFILE=gcp (docs/operator-gcp.md): the tests that call
# the CLI without --profile expect the shipped defaults.
os.environ.pop("SLM_NIGHTLY_PROFILE", None)

from tests.fakes.openai_server import FakeOpenAI  # noqa: E402


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(slow_seconds=2.0) as f:
        yield f


# Longest first (issue 36): xdist hands each worker whole modules (--dist loadfile) in collection
# order — the Makefile turns off xdist's own reordering by test count (--no-loadscope-reorder),
# which would put these few-test modules last — so a long module collected last would run alone
# at the end while the other core idles. The integration modules go first, the heaviest of them
# (seconds of worker time, measured on 2 cores under -n 2, 2026-12-06) at the head; the many
# short unit modules fill in at the end.
HEAVY = {"test_node_path.py": 360, "test_operator_guide.py": 290, "test_nightly.py": 300,
         "test_interrupt.py": 225, "test_train.py": 215, "test_quiet.py": 120,
         "test_teardown.py": 95, "test_image_build.py": 90, "test_gcp_orchestrator.py": 90,
         "test_node_preflight.py": 85, "test_weights.py": 85, "test_convert.py": 75,
         "test_graph_neo4j.py": 70, "test_deployment.py": 60, "test_alerts.py": 57,
         "test_node_install.py": 50}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def weight(item: pytest.Item) -> tuple[int, int]:
        path = item.path
        return (0 if "integration" in path.parts else 1, -HEAVY.get(path.name, 0))

    items.sort(key=weight)  # stable: a module's tests keep their order
