"""Prefect settings a local run needs, applied before Prefect is imported.

The user never has to export them; an explicit environment value still wins.
"""

import os

DEFAULTS = {
    # The first ephemeral-server start on a fresh PREFECT_HOME takes longer than the 20 s default.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
}


def apply() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
