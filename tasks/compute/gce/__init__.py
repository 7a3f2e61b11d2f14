"""The GPU node on Compute Engine: lifecycle.py (GceNode, the node protocol: start with zone and
spot fallbacks, wait, stop, preemption, usage) over api.py (the Compute calls and their one
retry; api_errors.py sorts their errors) and instance.py (the typed view of an instance);
placement.py orders the starts, cost.py prices them, record.py keeps the node record, and
engine.py with startup.py (rendering startup.sh and worker.sh) is what the node runs."""
