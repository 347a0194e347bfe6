"""The engine's exception tree. The app turns these into messages in one place."""
from __future__ import annotations


class EngineError(Exception):
    """Base class for every error the engine raises on purpose."""


class ModelLoadError(EngineError):
    """A model folder could not be loaded (missing/corrupt files, shape mismatches...)."""


class UnsupportedModelError(ModelLoadError):
    """The model is readable but its architecture or a feature is not supported."""


class GenerationError(EngineError, ValueError):
    """Generation could not run (bad arguments, prompt too long, depth not available...).
    Also a ``ValueError``: most are invalid arguments."""


class ChatTemplateError(GenerationError):
    """The model's chat template did not finish within its time/size budget."""


class PromptTooLongError(GenerationError):
    """The prompt does not fit in the model's context window."""


class HubError(EngineError):
    """Talking to the Hugging Face Hub failed."""


class StoreError(EngineError):
    """The local model store could not do what was asked."""


class ClusterError(EngineError):
    """A model split across machines (``engine.distributed``) cannot go on: a rank stopped
    answering, a hostfile is wrong, the ranks hold different model folders."""
