"""The work: one sub-package per domain (extraction, graph, corpus, training, compute)."""
