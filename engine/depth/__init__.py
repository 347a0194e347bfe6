"""Draft depth: the adaptive controller and the per-model tuner."""
