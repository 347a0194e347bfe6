"""The checks every request passes before anything reaches MLX: the prompt's ids and the
arguments of ``Model.generate`` / ``BatchDecoder.add`` (a bad one raises
``GenerationError``; a prompt the context cannot hold, ``PromptTooLongError``)."""
from __future__ import annotations

import numbers

from engine.errors import GenerationError, PromptTooLongError
from engine.types import DRAFT_MODES, MAX_DEPTH, SamplingParams


def check_prompt(model, prompt_ids) -> list[int]:
    """The prompt as a list of ints in ``0 <= id < vocab_size``, or a GenerationError."""
    if isinstance(prompt_ids, (str, bytes)):
        raise GenerationError("prompt_ids must be a sequence of token ids, not a string.")
    ids = list(prompt_ids)
    if not ids:
        raise GenerationError("The prompt is empty.")
    vocab = model.info.vocab_size
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise GenerationError(f"prompt_ids[{i}] is not an integer token id: {t!r}")
        if not 0 <= t < vocab:
            raise GenerationError(
                f"prompt_ids[{i}] = {t} is out of range: token ids go from 0 to {vocab - 1}.")
    return [int(t) for t in ids]


def check_request(model, prompt: list[int], *, max_tokens, depth, sampling, stop_strings,
                  drafter, draft_mode) -> int:
    """Validate the arguments of ``generate``; returns the token budget."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral):
        raise GenerationError(f"max_tokens must be an integer, not {max_tokens!r}")
    if max_tokens < 1:
        raise GenerationError(f"max_tokens must be at least 1, not {max_tokens}")
    if not isinstance(sampling, SamplingParams):
        raise GenerationError(f"sampling must be a SamplingParams, not {type(sampling).__name__}")
    if isinstance(stop_strings, str) or not all(isinstance(s, str) for s in stop_strings):
        raise GenerationError("stop_strings must be a list of strings (e.g. [\"\\n\\n\"]), "
                              f"not {stop_strings!r}")
    if draft_mode not in DRAFT_MODES:
        raise GenerationError(f"draft_mode must be one of {', '.join(DRAFT_MODES)}, "
                              f"not {draft_mode!r}")
    if depth != "auto" and (isinstance(depth, bool) or not isinstance(depth, int)
                            or not 0 <= depth <= MAX_DEPTH):
        raise GenerationError(f"depth must be 0..{MAX_DEPTH} or 'auto', not {depth!r}.")
    if depth != 0 and drafter is None and model.mtp is None:
        raise GenerationError(
            "This model has no MTP head, so it cannot speculate: use depth 0. "
            "(Converters such as mlx_lm.convert drop mtp.* tensors; convert from the official "
            "Qwen repo with `python -m engine pull REPO --convert` to keep them.)")
    ctx = model.info.context_length
    if len(prompt) >= ctx:
        raise PromptTooLongError(
            f"The prompt has {len(prompt)} tokens but the model's context is {ctx}. "
            "Shorten the conversation or start a new chat.")
    return min(int(max_tokens), ctx - len(prompt))
