"""Benchmarks: side by side, long context, streams, server load, depth simulation."""
