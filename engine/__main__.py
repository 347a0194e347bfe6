from engine.cli import run

raise SystemExit(run())
