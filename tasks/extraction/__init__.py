"""Documents in, entities and relationships out: loading, chunking, the LLM call, resolution."""
