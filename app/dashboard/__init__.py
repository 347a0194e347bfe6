"""The live speculative-decoding dashboard: ``window`` (the window), ``charts`` (its QPainter
widgets), ``demo`` (a simulated workload; ``python -m app.dashboard --demo``)."""
