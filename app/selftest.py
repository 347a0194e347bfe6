"""``--self-test`` (filled in by the chat window issue)."""
from __future__ import annotations


def run_self_test(args) -> int:
    print("self-test: not implemented yet")
    return 1
