"""tasks package."""

from tasks import prefect_env as _prefect_env

_prefect_env.apply()
