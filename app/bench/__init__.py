"""Developer benchmarks of the chat app (not used by the app itself):

- ``python -m app.bench.speed``: the app's tok/s against the engine's CLI (the real window, the
  demo model);
- ``python -m app.bench.ui``: the chat window's event-loop latency while a long reply streams
  from the scripted engine.
"""
