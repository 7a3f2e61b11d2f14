"""Prefect Block classes: configuration and credentials."""

from blocks.compute import LocalCompute
from blocks.graph import FalkorDBGraph, GraphBlock, Neo4jGraph
from blocks.inference import InferenceEndpoint
from blocks.serving import ServingEndpoint
from blocks.sources import DocumentSources

__all__ = ["DocumentSources", "FalkorDBGraph", "GraphBlock", "InferenceEndpoint", "LocalCompute",
           "Neo4jGraph", "ServingEndpoint"]
