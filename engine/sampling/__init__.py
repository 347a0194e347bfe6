"""Sampling: exact target distributions and acceptance, top-k candidates, grammars."""
