"""How long a prompt may be, checked before and while tokenizing, in bounded memory.

A fast tokenizer holds ~100-150 bytes per character of its input while it encodes (offsets
and alignments per byte, the encoding's per-token arrays): a 40 MB prompt handed to it at
once needs ~6 GB and can end the process inside Rust with no error to catch. So text is
never tokenized whole when it is long:

- ``encode_bounded(tokenizer, text, limit=N)`` returns exactly
  ``tokenizer.encode(text, add_special_tokens=False)`` when that has at most ``N`` tokens,
  and raises ``PromptTooLongError`` (with the numbers) otherwise. Text up to ``PIECE_CHARS``
  characters is encoded at once. Longer text is first compared with a bound that needs no
  tokenizing (no token spans more than the vocabulary's longest entry, so the text has at
  least ``len(text) / (4 * longest)`` tokens; the 4 covers Unicode normalization, which
  can merge up to 3 code points into one), then counted piece by piece (pieces of
  ``PIECE_CHARS`` cut after a newline or before a space, where the pre-tokenizer splits
  anyway), stopping as soon as the count is over; only when the count fits is it encoded
  whole, which then holds at most ~N tokens' worth of memory.
- ``prompt_limit(info, kv_bytes_per_token)``: the most prompt tokens a request may have —
  the context less one token to generate, and what the memory now available can hold of
  the caches (``MEMORY_SHARE`` of it), so a prompt that would exhaust the machine is refused
  with a 400 naming both numbers instead of swapping or crashing it.
- ``kv_bytes_per_token(trunk)``: the attention caches' bytes per token of a loaded trunk.

No Qt, no MLX at import.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

from engine.errors import PromptTooLongError

PIECE_CHARS = 256 * 1024      # encoded at once: ~40 MB of tokenizer memory at most
NORMALIZATION_FACTOR = 4      # NFC/NFKC merge at most 3 code points into 1 (Hangul L+V+T)
MEMORY_SHARE = 0.8            # of the memory available now, what one prompt's caches may use
OTHER_BYTES_PER_TOKEN = 1024  # ids, the prompt cache's bookkeeping, the encoding on the way


class _Tally:
    """A running token count over pieces of a long text."""

    def __init__(self, tokenizer, limit: int) -> None:
        self.tokenizer, self.limit, self.count, self.pieces = tokenizer, limit, 0, 0

    def add(self, piece: str) -> bool:
        """Count ``piece``; False once the total is certainly over the limit (each cut may
        join or split a pre-token, so a cut is allowed two tokens of slack)."""
        self.count += len(_encode(self.tokenizer, piece))
        self.pieces += 1
        return self.count <= self.limit + 2 * self.pieces


def encode_bounded(tokenizer, text: str, *, limit: int | None, what: str = "The prompt",
                   context: int | None = None) -> list[int]:
    """See the module docstring. ``limit=None``: no limit (the chat's own prompts, bounded by
    the app). ``context`` only words the error."""
    if limit is None or len(text) <= PIECE_CHARS:
        ids = _encode(tokenizer, text)
        if limit is not None and len(ids) > limit:
            raise _too_long(what, len(ids), limit, context, exact=True)
        return ids
    longest = longest_token_chars(tokenizer)
    at_least = len(text) // (NORMALIZATION_FACTOR * longest)
    if at_least > limit:
        raise _too_long(what, at_least, limit, context, exact=False)
    tally = _Tally(tokenizer, limit)
    for piece in pieces(text, PIECE_CHARS):
        if not tally.add(piece):
            release_memory()
            raise _too_long(what, tally.count - 2 * tally.pieces, limit, context, exact=False)
    ids = _encode(tokenizer, text)
    release_memory()
    if len(ids) > limit:
        raise _too_long(what, len(ids), limit, context, exact=True)
    return ids


def _encode(tokenizer, text: str) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=False)``, without transformers' warning
    that the ids are longer than the model's maximum (the caller checks the length)."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=False, verbose=False))
    except TypeError:  # a tokenizer without ``verbose`` (the tests' fakes)
        return list(tokenizer.encode(text, add_special_tokens=False))


def _too_long(what: str, n: int, limit: int, context: int | None, *, exact: bool):
    count = f"{n:,} tokens" if exact else f"at least {max(n, limit + 1):,} tokens"
    why = ""
    if context is not None and limit < context - 1:
        why = (f" (the model's context is {context:,} tokens; the memory available now "
               f"holds caches for {limit:,})")
    elif context is not None:
        why = f" (the model's context is {context:,} tokens, one is kept for the reply)"
    return PromptTooLongError(f"{what} has {count}, more than the {limit:,} this server can "
                              f"take{why}. Shorten it or start a new conversation.")


def pieces(text: str, size: int):
    """``text`` in consecutive pieces of at most ``size`` characters (joined they are
    ``text``), each cut after a newline or else before a space, where pre-tokenizers split."""
    start, n = 0, len(text)
    while start < n:
        end = min(start + size, n)
        if end < n:
            cut = text.rfind("\n", start + size // 2, end)
            if cut >= 0:
                end = cut + 1
            else:
                cut = text.rfind(" ", start + size // 2, end)
                end = cut if cut > start else end
        yield text[start:end]
        start = end


def longest_token_chars(tokenizer) -> int:
    """The most characters one token can stand for: the longest vocabulary entry (a
    byte-level entry has a character per byte, so this bounds its text too), at least 1."""
    cached = getattr(tokenizer, "_mtpchat_longest_token", None)
    if cached:
        return cached
    try:
        vocab = tokenizer.get_vocab()
        longest = max((len(k) for k in vocab), default=1)
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        longest = max([longest, *(len(str(getattr(t, "content", t))) for t in added.values())])
    except Exception:  # noqa: BLE001 - no vocabulary to read: assume one character a token
        longest = 1
    longest = max(int(longest), 1)
    try:
        tokenizer._mtpchat_longest_token = longest
    except Exception:  # noqa: BLE001 - a tokenizer that refuses attributes is asked again
        pass
    return longest


def kv_bytes_per_token(trunk) -> int:
    """Bytes the attention caches take per token (keys and values, every full-attention
    layer; Gated DeltaNet layers keep a fixed-size state). 0 when the trunk doesn't say."""
    args = getattr(trunk, "args", None)
    text = getattr(args, "text_config", None)
    cfg = text if isinstance(text, dict) else (vars(args) if args is not None else {})

    def num(key, default=0):
        v = cfg.get(key, default)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else default

    layers = num("num_hidden_layers")
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        full = sum(1 for t in types if t == "full_attention")
    else:
        interval = num("full_attention_interval", 1) or 1
        full = layers // interval
    heads = num("num_key_value_heads", num("num_attention_heads"))
    head_dim = num("head_dim") or (num("hidden_size") // max(num("num_attention_heads", 1), 1))
    dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    width = 4 if "32" in dtype else 2
    if num("kv_lora_rank"):  # MLA (DeepSeek-V3, GLM-4.7-Flash): the latent and rotary key
        return full * (num("kv_lora_rank") + num("qk_rope_head_dim")) * width
    return 2 * full * heads * head_dim * width


def available_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - unknown: the context alone limits
        return None


def prompt_limit(context_length: int, kv_per_token: int, *,
                 available: int | None = None) -> int:
    """The most prompt tokens one request may have now (see the module docstring)."""
    limit = max(context_length - 1, 1)
    avail = available_memory() if available is None else available
    if avail is not None:
        per_token = kv_per_token + OTHER_BYTES_PER_TOKEN
        limit = min(limit, max(int(avail * MEMORY_SHARE) // per_token, 1))
    return limit


def release_memory() -> None:
    """Hand freed heap back to the system after a large tokenization (glibc keeps it in its
    arenas otherwise: 1.2 GB stayed resident after counting a 10 MB prompt)."""
    if not sys.platform.startswith("linux"):
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None
