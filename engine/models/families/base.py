"""The one interface every checkpoint family implements (ARCHITECTURE.md, "a family seam").

A family knows four things the rest of the engine does not:

- its **checkpoint**: which tensors are the MTP head in the raw Hugging Face layout and in
  the MLX layout this engine writes, and what a broken one looks like (``validate``: header
  level, before any weight is read);
- its **trunk**: mlx-lm's class built from the config, its caches (``make_cache``);
- its **verify forward** and what rolling it back needs: ``forward_hidden`` returns the hidden
  states after the final norm and, with ``capture``, per-step states of layers that cannot be
  trimmed (Gated DeltaNet; ``{}`` for attention-only trunks, whose rollback is a KV trim the
  decoder already does on every trimmable cache);
- its **MTP head**: the module, and how its output becomes draft logits (``draft_logits``).

The decoder (``engine.decoding``) sees only these methods, through ``engine.models.model.Model``;
it never learns which family it runs.
"""
from __future__ import annotations

from abc import ABC, abstractmethod


class Family(ABC):
    """See the module docstring. ``name`` is ``ModelInfo.family``."""

    name: str = ""

    # -- the checkpoint -----------------------------------------------------------------
    @abstractmethod
    def has_mtp(self, cfg, names) -> bool:
        """Whether tensors named ``names`` hold this family's MTP head."""

    def validate(self, cfg, tensors: dict) -> None:
        """Header-level checks (names and shapes, no weights): raise ``ModelLoadError`` with
        one line naming the problem. The default checks nothing beyond the build."""

    @abstractmethod
    def build(self, cfg, weights: dict):
        """``engine.models.build.Built`` with ``weights`` in place (not evaluated)."""

    def build_trunk(self, cfg):
        raise NotImplementedError(f"{self.name}: no trunk builder")

    # -- the trunk --------------------------------------------------------------------------
    def text_model(self, trunk):
        """The module holding ``.model`` (embed_tokens, layers, norm) and the LM head."""
        return trunk

    def make_cache(self, trunk) -> list:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(trunk)

    @abstractmethod
    def forward_hidden(self, text_model, inputs, cache: list, *, capture: bool = False,
                       mark: int | None = None):
        """(hidden after the final norm [B, S, H], captures) for ``inputs`` [B, S]; ``mark``
        (where ``marks`` says so): the captures are the recurrent layers' states after that
        many tokens (``engine.models.trunk.forward_hidden``)."""

    def marks(self, tokens: int) -> bool:
        """Whether ``forward_hidden`` can give the state inside a prompt chunk of ``tokens``
        (else a caller that needs it there splits the chunk in two forwards)."""
        return False

    def lm_head(self, text_model, h):
        if getattr(text_model.args, "tie_word_embeddings", False):
            return text_model.model.embed_tokens.as_linear(h)
        return text_model.lm_head(h)

    def embed(self, text_model, tokens):
        return text_model.model.embed_tokens(tokens)

    # -- the MTP head -----------------------------------------------------------------------
    def draft_hidden(self, text_model, mtp, out):
        """What the LM head reads for the head's output ``out`` (what it returns and recurses
        on)."""
        return out

    def draft_logits(self, text_model, mtp, out):
        """Logits of the head's output ``out``."""
        return self.lm_head(text_model, self.draft_hidden(text_model, mtp, out))

    def head_rows(self, text_model):
        """The module whose rows are the LM head's rows (an Embedding or a Linear, plain or
        quantized: ``engine.decoding.draft_vocab`` takes some of them), or None where the head
        is split across ranks."""
        if getattr(text_model, "sharding_group", None) is not None:
            return None
        if getattr(text_model.args, "tie_word_embeddings", False):
            return text_model.model.embed_tokens
        return getattr(text_model, "lm_head", None)
