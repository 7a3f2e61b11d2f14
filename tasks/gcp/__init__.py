"""`slm-nightly gcp …`: a Google Cloud project set up, checked and torn down as code."""
