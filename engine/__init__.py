"""MTP Chat's inference engine: exact multi-token-prediction speculative decoding on MLX.

The engine knows nothing about Qt. It loads Qwen3.5/3.6 models with their MTP heads, drafts
with them, verifies drafts in one batched forward and keeps what rejection sampling allows.
Importing this package first loads an optimized BLAS on Linux (before MLX is imported).
"""
from __future__ import annotations

from engine._blas import ensure_fast_blas as _ensure_fast_blas

_ensure_fast_blas()

from engine.errors import (  # noqa: E402
    EngineError,
    GenerationError,
    HubError,
    ModelLoadError,
    PromptTooLongError,
    StoreError,
    UnsupportedModelError,
)
from engine.types import CycleStats, Event, ModelInfo, PrefillStats, SamplingParams  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CycleStats", "EngineError", "Event", "GenerationError", "HubError", "Model", "ModelInfo",
    "ModelLoadError", "PrefillStats", "PromptTooLongError", "SamplingParams", "StoreError",
    "UnsupportedModelError", "__version__", "load", "default_model_path",
]


def __getattr__(name: str):
    # Heavy imports (mlx, transformers) happen only when a model is actually needed.
    if name in ("load", "Model"):
        from engine.models import model as _model

        return getattr(_model, name)
    if name == "default_model_path":
        from engine.resources import default_model_path

        return default_model_path
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
