"""The night's preflight of a GCE profile, by what it asks: Google (google.py), the
orchestrator's own buckets, blocks, graph and folders (orchestrator.py), Prefect (prefect_api.py)
and the node (node.py); run.py runs them all and holds the report. It checks every domain, so it
sits above them, beside tasks/profile.py."""
