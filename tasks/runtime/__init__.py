"""The CLI's runtime, not a domain: where a run's output goes, how Ctrl-C and SIGTERM stop it,
and the Prefect settings and temporary server it runs under."""
