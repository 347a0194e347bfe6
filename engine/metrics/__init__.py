"""A reply's figures (summary) and the live aggregates (stats)."""
