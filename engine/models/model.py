"""``engine.load(path) -> Model``: the trunk (mlx-lm's classes) plus this project's MTP head.

The MTP head shares ``embed_tokens`` and the LM head with the trunk. The +1 shift of
zero-centred norms is applied exactly once: by mlx-lm's sanitize for the trunk and by
``sanitize_mtp`` for the head, both only when the checkpoint is in raw HF layout.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

from engine.decoding.drafters import Drafter
from engine.errors import ModelLoadError, UnsupportedModelError
from engine.models import loading
from engine.sampling.grammar import Constraint
from engine.types import MAX_DEPTH, DraftMode, Event, ModelInfo, SamplingParams

log = logging.getLogger(__name__)


class Model:
    """A loaded model: weights, tokenizer and facts. Not thread-safe: one thread owns it (MLX
    streams are thread-local). What carries from one reply to the next (prompt cache, disk
    cache, depth controllers) is the engine core's (``engine.core.carryover``), not the
    model's; ``generate`` and ``decoder`` use the model's shared one unless given another.
    """

    def __init__(self, *, trunk, mtp, tokenizer, info: ModelInfo, vision=None,
                 vision_config: dict | None = None) -> None:
        from engine.models import families

        self.trunk = trunk            # the family's mlx-lm Model
        self.mtp = mtp                # the family's MTP head | None
        self.vision = vision          # engine.vision.encoder.VisionEncoder | None
        self.vision_config = vision_config or {}  # image token ids, preprocessing
        self.vision_stats = {"calls": 0, "images": 0, "preprocess_s": 0.0, "encoder_s": 0.0}
        self.tokenizer = tokenizer
        self.info = info
        self.family = families.get(info.family)  # engine.models.families.base.Family
        self._kv_bytes: int | None = None
        self.decoder_factory = None   # set on a rank of a cluster (engine.distributed)
        self._prompt_view: PromptView | None = None

    @property
    def text_model(self):
        return self.family.text_model(self.trunk)

    # -- the family seam, as the decoder calls it (engine.models.families.base.Family) --------
    def make_cache(self) -> list:
        return self.family.make_cache(self.trunk)

    def forward_hidden(self, inputs, cache: list, *, capture: bool = False,
                       mark: int | None = None):
        """(trunk hidden after the final norm, per-step captures) for ``inputs`` [B, S];
        ``mark``: the recurrent layers' states after that many tokens instead (``marks``)."""
        return self.family.forward_hidden(self.text_model, inputs, cache, capture=capture,
                                          mark=mark)

    def marks(self, tokens: int) -> bool:
        """Whether a prompt chunk of ``tokens`` can give its state inside (``forward_hidden``'s
        ``mark``) on this model and device."""
        return self.family.marks(tokens)

    def lm_head(self, h):
        return self.family.lm_head(self.text_model, h)

    def embed(self, tokens):
        return self.family.embed(self.text_model, tokens)

    def draft_logits(self, out):
        """Logits of the MTP head's output ``out``."""
        return self.family.draft_logits(self.text_model, self.mtp, out)

    def draft_hidden(self, out):
        """What the LM head reads for the MTP head's output ``out``."""
        return self.family.draft_hidden(self.text_model, self.mtp, out)

    def head_rows(self):
        """The module whose rows are the LM head's, or None (``Family.head_rows``)."""
        return self.family.head_rows(self.text_model)

    def chat_ids(self, messages: list[dict], *, enable_thinking: bool | None = None,
                 add_generation_prompt: bool = True) -> list[int]:
        """Apply the model's chat template (sandboxed, with a time and size budget)."""
        return _chat_ids(self, messages, enable_thinking, add_generation_prompt)

    def chat_prompt(self, messages: list[dict], *, enable_thinking: bool | None = None,
                    add_generation_prompt: bool = True):
        """``chat_ids`` for messages whose content may hold image parts: an
        ``engine.vision.prompt.ImagePrompt`` when one does (the engine/app contract:
        ``engine/vision/__init__.py``), else the plain ids."""
        from engine.vision.prompt import chat_prompt

        return chat_prompt(self, messages, enable_thinking=enable_thinking,
                           add_generation_prompt=add_generation_prompt)

    @property
    def image_token_id(self) -> int | None:
        return self.vision_config.get("image_token_id")

    @property
    def image_config(self):
        """The image preprocessing numbers (``engine.vision.preprocess.ImageConfig``)."""
        got = self.__dict__.get("_image_config")
        if got is None:
            from engine.vision.preprocess import ImageConfig

            got = self.__dict__["_image_config"] = ImageConfig.from_folder(
                Path(self.info.path), self.vision_config.get("vision_config") or {})
        return got

    def prompt_limit(self) -> int:
        """The most prompt tokens a reply can start from now: the context less one, and
        what the memory available holds of the caches (``engine.models.prompt_limits``)."""
        from engine.models.prompt_limits import kv_bytes_per_token, prompt_limit

        if self._kv_bytes is None:
            self._kv_bytes = kv_bytes_per_token(self.trunk)
        return prompt_limit(self.info.context_length, self._kv_bytes)

    def prompt_view(self) -> PromptView:
        """What request threads render and tokenize with while this model decodes on its
        own thread (made once; see ``PromptView``)."""
        if self._prompt_view is None:
            self._prompt_view = PromptView(self)
        return self._prompt_view

    def generate(self, prompt_ids: list[int], *, max_tokens: int = 256, depth: int | str = 0,
                 sampling: SamplingParams | None = None, seed: int | None = None,
                 cancel: threading.Event | None = None, stop_strings: tuple[str, ...] = (),
                 drafter: Drafter | None = None, draft_mode: DraftMode = "filtered",
                 profile: bool = False, constraint: Constraint | None = None,
                 carryover=None) -> Iterator[Event]:
        """Stream one reply's events: a batch of one through the one decoder
        (``engine.decoding.decoder``). Every argument is checked here, before anything reaches
        MLX: a bad one raises ``GenerationError``. ``drafter`` replaces the MTP head (e.g.
        ``ReplayDrafter``); ``draft_mode`` is the head's draft policy (``engine.decoding.drafters``);
        ``profile`` synchronises after every phase; ``constraint``: structured output
        (``engine.sampling.grammar.Constraint.for_format``), one per reply; ``carryover``: the prompt
        cache and depth controllers to use (default: the model's shared one)."""
        from engine.decoding.decoder import generate

        return generate(self, prompt_ids, carryover=carryover, max_tokens=max_tokens,
                        depth=depth, sampling=SamplingParams() if sampling is None else sampling,
                        seed=seed, cancel=cancel, stop_strings=stop_strings, drafter=drafter,
                        draft_mode=draft_mode, profile=profile, constraint=constraint)

    def decoder(self, *, max_streams: int, carryover=None):
        """A decoder for up to ``max_streams`` replies at once (``BatchDecoder``), reading
        and writing ``carryover`` (default: the model's shared one); a model split across
        machines makes its cluster's (``decoder_factory``: ``engine.distributed.lockstep``)."""
        from engine.decoding.decoder import BatchDecoder

        if self.decoder_factory is not None:
            return self.decoder_factory(self, max_streams=max_streams, carryover=carryover)

        return BatchDecoder(self, carryover=carryover, max_streams=max_streams)


class PromptView:
    """A model as prompt rendering sees it, for threads other than the one decoding: the
    same ``info``, ``chat_ids`` and ``prompt_limit``, but its own copy of the tokenizer, so
    rendering and tokenizing a long request never waits for a decode step, nor a decode
    step for it (the worker detokenizes with the model's own). ``lock`` serialises the
    threads that use this copy (``Scheduler.with_tokenizer`` holds it)."""

    def __init__(self, model: Model) -> None:
        import copy

        self.info = model.info
        self.tokenizer = copy.deepcopy(model.tokenizer)
        self.lock = threading.Lock()
        self._model = model

    def prompt_limit(self) -> int:
        return self._model.prompt_limit()

    def chat_ids(self, messages: list[dict], *, enable_thinking: bool | None = None,
                 add_generation_prompt: bool = True) -> list[int]:
        return _chat_ids(self, messages, enable_thinking, add_generation_prompt)

    # what ``engine.vision.prompt.chat_prompt`` reads: the model's vision facts
    @property
    def vision(self):
        return self._model.vision

    @property
    def image_token_id(self) -> int | None:
        return self._model.image_token_id

    @property
    def image_config(self):
        return self._model.image_config

    def chat_prompt(self, messages: list[dict], *, enable_thinking: bool | None = None,
                    add_generation_prompt: bool = True):
        from engine.vision.prompt import chat_prompt

        return chat_prompt(self, messages, enable_thinking=enable_thinking,
                           add_generation_prompt=add_generation_prompt)


def _chat_ids(owner, messages: list[dict], enable_thinking: bool | None,
              add_generation_prompt: bool) -> list[int]:
    """``owner``'s chat template over ``messages``, within its prompt limit (a ``Model`` or
    its ``PromptView``: the same rendering, each with its own tokenizer)."""
    from engine.models.chat_template import chat_ids

    return chat_ids(owner.tokenizer, messages, enable_thinking=enable_thinking,
                    supports_thinking=owner.info.supports_thinking,
                    add_generation_prompt=add_generation_prompt,
                    max_tokens=owner.prompt_limit(), context=owner.info.context_length)


def load(path: str | Path, *, dtype: str | None = None, prepare=None) -> Model:
    """Load a model: a folder, an installed model's name, or the repo id it was pulled from.

    ``dtype`` ("float32", "bfloat16", "float16") casts float weights. The config and every
    safetensors header are validated (``engine.models.checkpoint``) before the tokenizer is read, and
    any failure while building becomes a ModelLoadError naming what did not fit.
    ``prepare(built, checkpoint)`` runs on the built modules before any weight is read (a rank
    of a cluster keeps only its shard: ``engine.distributed.node``).
    """
    import mlx.core as mx

    from engine.core.threadexit import note_mlx_thread
    from engine.hub.store import resolve_model
    from engine.models import cpu_products, families
    from engine.models.build import build
    from engine.models.checkpoint import read_checkpoint

    if dtype is not None and dtype not in _DTYPES:
        raise ModelLoadError(f"dtype must be one of {', '.join(_DTYPES)}, not {dtype!r}.")
    folder = resolve_model(path)
    ckpt = read_checkpoint(folder)
    tokenizer = loading.load_tokenizer(folder)
    built = build(ckpt.config, loading.load_arrays(ckpt))
    if prepare is not None:
        prepare(built, ckpt)
    if dtype is not None:
        _cast(built, getattr(mx, dtype))
    note_mlx_thread()
    family = families.get(ckpt.config.family)
    head = family.head_rows(family.text_model(built.trunk))  # a tied head: the embedding
    for part in (built.trunk, built.mtp):  # laid out for OpenBLAS (engine/models/cpu_products.py)
        if part is not None:
            cpu_products.adopt(part, head)
    try:
        mx.eval(built.trunk.parameters(), built.mtp.parameters() if built.mtp else {},
                built.vision.parameters() if built.vision is not None else {},
                [c for part in (built.trunk, built.mtp) if part is not None
                 for c in cpu_products.copies(part)])
    except Exception as exc:  # noqa: BLE001 - e.g. a shard changed on disk while loading
        raise ModelLoadError(f"The weights could not be read: {exc}. Re-download the model.") \
            from exc
    info = _model_info(folder, ckpt, built, tokenizer, dtype)
    log.info("loaded %s (%s, %s layout, %.1fM params, MTP=%s)", info.name, info.family,
             info.layout, info.num_parameters / 1e6, info.has_mtp)
    return Model(trunk=built.trunk, mtp=built.mtp, tokenizer=tokenizer, info=info,
                 vision=built.vision, vision_config=_vision_config(ckpt.config, built))


def _vision_config(cfg, built) -> dict:
    """What image prompts need from config.json: the special token ids, the vision config."""
    if built.vision is None:
        return {}
    raw = cfg.raw
    return {k: raw.get(k) for k in ("image_token_id", "vision_start_token_id",
                                     "vision_end_token_id", "vision_config")}


_DTYPES = ("float32", "bfloat16", "float16")
_KEEP_FP32 = ("A_log", "e_score_correction_bias")  # as mlx-lm keeps them


def _cast(built, target) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    for m in (built.trunk, built.mtp, built.vision):
        if m is None:
            continue
        # set_dtype's predicate sees dtypes, not names: cast by path to keep A_log (and
        # a router's correction bias) as is.
        m.load_weights([(k, v.astype(target)) for k, v in tree_flatten(m.parameters())
                        if mx.issubdtype(v.dtype, mx.floating) and not k.endswith(_KEEP_FP32)],
                       strict=False)


def _model_info(folder: Path, ckpt, built, tokenizer, dtype: str | None) -> ModelInfo:
    from mlx.utils import tree_flatten

    from engine.paths import folder_size

    cfg = ckpt.config
    params = sum(v.size for _, v in tree_flatten(built.trunk.parameters()))
    if built.mtp is not None:
        params += sum(v.size for _, v in tree_flatten(built.mtp.parameters()))
    first = next(iter(built.trunk_weights.values()))
    template = getattr(tokenizer, "chat_template", None) or ""
    has_mtp = built.mtp is not None
    return ModelInfo(
        path=str(folder), name=folder.name, architecture=cfg.architecture, family=cfg.family,
        layout="hf" if built.raw_layout else "mlx", num_parameters=int(params),
        bytes_on_disk=folder_size(folder), quantization=cfg.quantization,
        has_mtp=has_mtp, mtp_layers=built.mtp_layers, max_depth=MAX_DEPTH if has_mtp else 0,
        context_length=int(cfg.text.get("max_position_embeddings") or 32768),
        vocab_size=int(cfg.text["vocab_size"]), hidden_size=int(cfg.text["hidden_size"]),
        num_layers=int(cfg.text["num_hidden_layers"]),
        dtype=str(dtype or first.dtype).replace("mlx.core.", ""),
        eos_token_ids=loading.eos_ids(folder, cfg, tokenizer),
        supports_thinking="enable_thinking" in template, notes=built.notes,
        vision=built.vision is not None)


__all__ = ["Model", "load", "UnsupportedModelError", "ModelLoadError"]
