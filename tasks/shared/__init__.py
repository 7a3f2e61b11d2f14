"""Shared helpers every layer of tasks/ may use: errors that say their fix, atomic files,
project paths, waiting and backoff, child processes, checks, GCS copies, code and environment
digests, and the Prefect slots that say who owns the GPU and the node."""
