"""Hardening suite (issue 12): bad inputs built here, run through the CLI, the API and the store.

Every case asserts the exit code (or the error class), that no ``Traceback`` reaches the user
and that the message names the problem. CLI cases run in child processes (``cli_batch``), so a
native crash or a hang fails the test instead of killing the test run.
"""
