"""Keep PyTorch out of a process that only runs MLX.

transformers imports torch at module level wherever it is installed (configuration_utils ->
modeling_rope_utils: ``if is_torch_available(): import torch``), and loading a tokenizer goes
through that module. In a development environment with the ``train`` extra that put 1-4 s of
start-up and gigabytes of address space (CUDA wheels) into every ``engine serve`` and app
process, for a library that never runs there. The engine, the server and the app call
:func:`keep_torch_out` before transformers is first imported; ``train-demo`` (the one verb
that trains with torch) and test processes (transformers references) do not.
"""
from __future__ import annotations

import sys


def keep_torch_out() -> bool:
    """Make transformers treat torch as absent in this process. Returns whether it did:
    not when torch or transformers' configuration module is already imported (too late)."""
    if "torch" in sys.modules or "transformers.configuration_utils" in sys.modules:
        return False
    import transformers.utils.import_utils as iu

    original = iu.is_torch_available

    def absent() -> bool:
        return False

    # every transformers module loaded so far that bound the check by name (transformers.utils,
    # utils.generic, ...); modules imported later bind the replacement
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers") and getattr(module, "is_torch_available", None) is original:
            module.is_torch_available = absent
    return True
