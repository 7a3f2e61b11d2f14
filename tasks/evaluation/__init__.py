"""`slm-nightly eval extraction`: phase 1's own code on chunks whose facts are known (a gold
set), scored (metrics.py), written as JSON and compared with a saved baseline (gate.py).

gold.py reads the cases; runner.py sends them through the pipeline (extract_documents,
build_batch) against an endpoint, starting the profile's local engine when none is given;
metrics.py scores the resolved batches; report.py prints the table.
"""
