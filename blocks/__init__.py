"""Prefect Block classes: configuration and credentials."""

from tasks import prefect_env as _prefect_env

_prefect_env.apply()

from blocks.compute import LocalCompute  # noqa: E402
from blocks.graph import FalkorDBGraph, GraphBlock, Neo4jGraph  # noqa: E402
from blocks.inference import InferenceEndpoint  # noqa: E402
from blocks.sources import DocumentSources  # noqa: E402

__all__ = ["DocumentSources", "FalkorDBGraph", "GraphBlock", "InferenceEndpoint", "LocalCompute",
           "Neo4jGraph"]
