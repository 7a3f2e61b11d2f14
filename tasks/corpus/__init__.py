"""The training corpus: buckets, the Polars scorecard, the phase-2 hand-over."""
