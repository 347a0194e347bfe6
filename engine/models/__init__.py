"""Model-side code of the engine: forwards, layers and the device branch they run."""
