"""Property-graph stores behind one protocol: FalkorDB (embedded default) and Neo4j."""
