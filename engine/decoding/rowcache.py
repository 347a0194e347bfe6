"""Caches for a batch of rows that each have their own length (``engine.decoding.batch_caches``).

``RowKVCache`` is an attention KV cache for B rows in one padded buffer ``[B, H, T, D]``: row
b's tokens sit at positions ``0 .. lengths[b] - 1`` (so its RoPE positions are the ones it
would have alone), and a forward over S tokens writes row b's at ``lengths[b] ..
lengths[b] + S - 1``. Positions past a row's length hold stale values that its mask hides
(``make_mask``) and its next write overwrites, so trimming a row (a rejected draft) is only a
change of its length: no data moves. It speaks mlx-lm's cache protocol (``offset`` for RoPE,
``update_and_fetch``, ``make_mask``), so mlx-lm's attention layers and this project's MTP head
run on it unchanged. With a ``window`` (the MTP head's draft steps:
``batch_caches.draft_window``) each query sees only its own row's last ``window`` positions,
and ``update_and_fetch`` returns the keys from the first position any row still sees.

With ``buckets`` (the CPU branch: ``key_buckets()``) and from ``BLOCKS_FROM`` positions on,
``update_and_fetch`` returns the keys in whole blocks of ``STEP`` positions (from a multiple
of ``STEP`` to the end of the block that holds the last key) and ``make_mask`` always hides
what lies past each row's length or before its window. Exact: a hidden key's weight is 0.
Why: MLX's CPU allocator is glibc's ``malloc``, and a decode step's attention temporaries
were one key larger than the step before's. After a prefill, glibc then served every step's
temporaries from fresh pages (a reply right after a 12k-token prompt on the demo: 16.2 ms a
step against 10.7 for the same reply resumed from the prompt cache, 35,000 page faults and
+142 MB resident in 79 tokens; the same with glibc's trim and mmap thresholds raised). In
blocks the temporaries keep one size for ``STEP`` steps and glibc reuses their memory.

The Gated DeltaNet layers keep mlx-lm's ``ArraysCache`` ([conv window, recurrent state], one
row per stream): their state is per row already, and its own ``extend`` / ``filter`` /
``extract`` add, keep and take out rows (``engine.decoding.batch_caches``).
"""
from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

STEP = 256  # buffer growth, as mlx-lm's KVCache (and the blocks of ``buckets``)
# ``buckets`` returns whole blocks from this many positions on: below, a step's temporaries
# are small and a block's up to 255 extra keys cost more than they save (3-4 % of a decode
# step on the demo at 100-300 tokens)
BLOCKS_FROM = 4096
BUCKETS_ENV = "MTPCHAT_KEY_BUCKETS"


def key_buckets() -> bool:
    """Whether a batch's attention caches return their keys in whole blocks
    (``RowKVCache(buckets=True)``): ``$MTPCHAT_KEY_BUCKETS`` (0 or 1), else on the CPU branch
    (MLX's Metal allocator keeps freed buffers by size; its fast attention is faster without a
    mask)."""
    from engine.models import cpu_products, device

    value = cpu_products.env_switch(BUCKETS_ENV, "deciding by the device")
    return device.is_cpu() if value is None else value


def _capacity(n: int) -> int:
    return max(STEP, -(-n // STEP) * STEP)


class RowKVCache:
    """See the module docstring. ``lengths`` is known on the host (a list of ints)."""

    def __init__(self, keys: mx.array | None = None, values: mx.array | None = None,
                 lengths: list[int] | None = None, *, window: int | None = None,
                 buckets: bool = False) -> None:
        self.keys, self.values = keys, values
        self.buckets = buckets
        self.lengths: list[int] = list(lengths or [])
        # the query at position p attends to positions p - window + 1 .. p only (None: all)
        if window is not None and window < 1:
            raise ValueError(f"an attention window must be at least 1 position, not {window}")
        self.window = window
        # each row's M-RoPE shift past its images (``engine.models.trunk.shifted_offset``)
        self.rope_delta: list[int] = [0] * len(self.lengths)

    # -- mlx-lm's cache protocol ------------------------------------------------------------
    @property
    def offset(self) -> mx.array:
        """Each row's first new position [B] (RoPE offsets)."""
        return mx.array(self.lengths, dtype=mx.int32)

    def _blocked(self, end: int) -> bool:
        """Whether the keys go out in whole blocks once ``end`` positions are written
        (``buckets``, from ``BLOCKS_FROM`` positions on)."""
        return self.buckets and end >= BLOCKS_FROM

    def _start(self, end: int) -> int:
        """The first buffer position any query of the next tokens (up to position ``end``)
        sees: 0, or with a ``window`` the earliest first position of a row's window (the keys
        before it are seen by no row, so ``update_and_fetch`` leaves them out), at the start
        of its block where ``_blocked``."""
        if self.window is None or not self.lengths:
            return 0
        first = max(0, min(self.lengths) - self.window + 1)
        return first - first % STEP if self._blocked(end) else first

    def _stop(self, end: int) -> int:
        """The buffer position after the last key returned when ``end`` positions are
        written: ``end``, or where ``_blocked`` the end of its block."""
        return _capacity(end) if self._blocked(end) else end

    def _windowed(self, n: int) -> bool:
        """Whether the window hides any key a causal mask would show to one of the next
        ``n`` queries (the last query of the longest row sees the most)."""
        if self.window is None or not self.lengths:
            return False
        end = max(self.lengths) + n
        return self._blocked(end) or end > self.window

    def make_mask(self, n: int, return_array: bool = False, window_size=None):
        """[B, 1, n, T] bool: query j of row b sees positions ``<= lengths[b] + j`` (and with
        a ``window``, ``> lengths[b] + j - window``); T is what ``update_and_fetch`` will
        return (from ``_start``). None when every row has the same length and n == 1
        (nothing to hide)."""
        if window_size is not None:
            raise NotImplementedError("sliding-window attention is not batched")
        end = max(self.lengths, default=0) + n
        if n == 1 and len(set(self.lengths)) <= 1 and not return_array \
                and not self._blocked(end):
            return None  # (with a window, ``_start`` leaves exactly the keys it keeps)
        start, windowed, t = self._start(end), self._windowed(n), self._stop(end)
        last = self.offset[:, None, None, None] + mx.arange(n)[None, None, :, None]
        pos = mx.arange(start, t)[None, None, None, :]
        keep = pos <= last
        if windowed:
            keep = keep & (pos > last - self.window)
        return keep

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        n = keys.shape[2]
        end = max(self.lengths) + n
        first = self._start(end)
        self._reserve(end, keys, values)
        if len(set(self.lengths)) == 1:
            start = self.lengths[0]
            self.keys[..., start:start + n, :] = keys
            self.values[..., start:start + n, :] = values
        else:  # one scatter per buffer: row b's n positions from its own length
            pos = self.offset[:, None, None, None] + mx.arange(n)[None, None, :, None]
            self.keys = mx.put_along_axis(self.keys, mx.broadcast_to(pos, keys.shape), keys,
                                          axis=2)
            self.values = mx.put_along_axis(self.values, mx.broadcast_to(pos, values.shape),
                                            values, axis=2)
        self.lengths = [length + n for length in self.lengths]
        stop = self._stop(end)
        return self.keys[..., first:stop, :], self.values[..., first:stop, :]

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Forget the last ``n`` positions of every row."""
        self.lengths = [max(0, length - n) for length in self.lengths]
        return n

    def trim_rows(self, n: list[int]) -> None:
        """Forget the last ``n[b]`` positions of row b."""
        self.lengths = [max(0, length - k) for length, k in zip(self.lengths, n)]

    @property
    def state(self):
        return self.keys, self.values

    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    # -- rows joining and leaving -----------------------------------------------------------
    def _reserve(self, end: int, keys: mx.array, values: mx.array) -> None:
        if self.keys is not None and self.keys.shape[2] >= self._stop(end):
            return
        B, H, _, dk = keys.shape
        cap = _capacity(end)
        new_k = mx.zeros((B, H, cap, dk), keys.dtype)
        new_v = mx.zeros((B, H, cap, values.shape[3]), values.dtype)
        if self.keys is not None:
            old = self.keys.shape[2]
            new_k[..., :old, :] = self.keys
            new_v[..., :old, :] = self.values
        self.keys, self.values = new_k, new_v

    def join(self, single: KVCache, delta: int = 0) -> None:
        """Append one stream's cache (mlx-lm's ``KVCache``, batch 1) as a new last row
        (``delta``: its M-RoPE shift)."""
        n = single.offset
        if single.keys is None:
            raise ValueError("a stream joins after its prefill (its KV cache is empty)")
        k, v = single.keys[..., :n, :], single.values[..., :n, :]
        if self.keys is None:
            self.keys, self.values, self.lengths, self.rope_delta = k, v, [], []
            self.lengths.append(n)
            self.rope_delta.append(delta)
            self._reserve(n, k, v)
            return
        cap = max(self.keys.shape[2], _capacity(n))
        self.keys = mx.concatenate([_pad_to(self.keys, cap), _pad_to(k, cap)])
        self.values = mx.concatenate([_pad_to(self.values, cap), _pad_to(v, cap)])
        self.lengths.append(n)
        self.rope_delta.append(delta)

    def take(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order); the buffer shrinks to the longest kept row."""
        self.lengths = [self.lengths[r] for r in rows]
        self.rope_delta = [self.rope_delta[r] for r in rows]
        if not rows:
            self.keys = self.values = None
            return
        cap = _capacity(max(self.lengths))
        idx = mx.array(rows, dtype=mx.int32)
        self.keys = mx.take(self.keys, idx, axis=0)[..., :cap, :]
        self.values = mx.take(self.values, idx, axis=0)[..., :cap, :]

    def extract(self, b: int, n: int | None = None) -> KVCache:
        """Row b (its first ``n`` positions; default all) as a stand-alone mlx-lm
        ``KVCache`` (a copy)."""
        n = self.lengths[b] if n is None else n
        c = KVCache()
        k = mx.contiguous(self.keys[b:b + 1, :, :n, :])
        v = mx.contiguous(self.values[b:b + 1, :, :n, :])
        c.keys, c.values, c.offset = _pad_to(k, _capacity(n)), _pad_to(v, _capacity(n)), n
        if self.rope_delta[b]:
            c.rope_delta = self.rope_delta[b]
        return c


def _pad_to(x: mx.array, t: int) -> mx.array:
    if x.shape[2] >= t:
        return x[..., :t, :]
    return mx.pad(x, [(0, 0), (0, 0), (0, t - x.shape[2]), (0, 0)])
