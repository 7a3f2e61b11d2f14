"""The preflight's Prefect API check when the API does not answer: one failed check naming the
URL and the fix, and nothing asked of the profile (a regression: the check's own name once
shadowed the helper that builds it, and the preflight died with a TypeError instead)."""

from __future__ import annotations

from typing import Any

from tasks.preflight.prefect_api import prefect_checks
from tasks.shared.processes import free_port


def test_an_api_that_does_not_answer_is_one_failed_check_with_the_fix() -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    nothing: Any = None  # the profile and the block are not read before the API answers
    with temporary_settings(updates={PREFECT_API_URL: url}):
        checks = list(prefect_checks(nothing, nothing, night=True, training=False))
    assert [(c.name, c.ok) for c in checks] == [("Prefect API", False)]
    assert checks[0].detail.startswith(f"{url} does not answer: ")
    assert checks[0].fix == "start the Prefect server, or fix PREFECT_API_URL"
