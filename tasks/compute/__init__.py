"""Where the work runs: the node (local or GCE), the inference server, GPU slots."""
