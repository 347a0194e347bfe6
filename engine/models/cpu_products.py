"""Weight products in column blocks OpenBLAS computes with its small-matrix kernel.

MLX computes ``x @ W.T`` on a Linux CPU with OpenBLAS's ``sgemm``. On the x86 cores with
AVX-512 (OpenBLAS's SkylakeX, Cooperlake and SapphireRapids kernels) ``sgemm`` takes a
direct small-matrix kernel when its permit allows -- for this transposed product, rows x
columns <= 1200 and rows x columns x inner <= 100**3 -- and otherwise packs the whole weight
into a scratch buffer first. A decode step's products (one row) mostly pass; a verify's (one
row per drafted token) mostly do not, and the LM head never does: packing was 20 % of a depth-3
decode's time on the demo, more than the products themselves.

``adopt(module)`` turns every plain ``nn.Linear`` and ``nn.Embedding`` (its ``as_linear``, the
tied LM head) of a model into a subclass whose product splits the weight's rows (the output
columns) into blocks within the permit, for up to ``MAX_ROWS`` input rows and where a block
carries enough work, computed as one batched product over the blocks (MLX calls ``sgemm`` once
per block; one graph node instead of a concatenation of one per block: the 0.8B shape's LM head
at 4 rows 88 -> 66-71 ms). Each output element is then the small kernel's dot product, so a
row's result is the same bits alone, in a verify or in a batch, at every row count for which
``small_kernel`` holds (OpenBLAS's two paths round differently: with whole products a row alone
and the same row among four were not bit-identical for 512 x 192 or 1024 x 192 weights).
Elsewhere (Accelerate, other BLAS) nothing changes.
The small kernel runs on one thread, the packed path on all of OpenBLAS's: with more than two
threads a product OpenBLAS would spread over them stays whole (measured with one and two
threads only: ``docs/benchmarks.md``). ``MTPCHAT_BLOCK_PRODUCTS=0`` turns it off, ``=1`` on.

On the other OpenBLAS cores (AVX2's Haswell and Zen kernels: no small kernel, so ``sgemm``
always packs), a weight kept column-major -- its transpose stored contiguously, the module's
``weight`` a transposed view of that, same shape and values -- makes ``x @ weight.T`` a product
OpenBLAS computes faster: 25-32 % for the demo's LM head at 1-32 rows, 10-20 % for its
512 x 192 layers (alone, ``docs/benchmarks.md``). A whole reply gains less, 0-10 % at depths
0 and 3 alike: on the demo the products are about half of a cycle's work. ``adopt`` then lays
every plain ``Linear`` out so (no extra memory) and gives the tied LM head it is shown
(``Embedding.as_linear``) a column-major copy where that copy is at most ``TIED_COPY_MAX`` (the
lookup keeps reading rows). ``MTPCHAT_COLUMN_WEIGHTS=0`` turns it off, ``=1`` on.
"""
from __future__ import annotations

import ctypes
import logging
import math
import os

import mlx.core as mx
import mlx.nn as nn

from engine import _blas

log = logging.getLogger(__name__)

ENV = "MTPCHAT_BLOCK_PRODUCTS"
SMALL_KERNEL_CORES = ("skylakex", "cooperlake", "sapphirerapids")
MAX_RN = 1200          # OpenBLAS's permit for the transposed small kernel: rows x columns
MAX_RNK = 100 ** 3     # and rows x columns x inner
MIN_BLOCK_WORK = 12288    # columns x inner of a block, at least: blocks of 32 x 192 or 8 x 1024
                          # were no faster than the packed product (docs/benchmarks.md)
MAX_ROWS = 64             # the permit leaves blocks too narrow beyond (16 x 1024 at 64 rows)
SERIAL_MNK = 4 * 65536    # OpenBLAS computes a product below this on one thread anyway
COLUMNS_ENV = "MTPCHAT_COLUMN_WEIGHTS"
TIED_COPY_MAX = 64 << 20  # bytes: a tied head's column-major copy (the demo's: 3 MiB)
_SWITCH = {"0": False, "false": False, "off": False, "no": False,
           "1": True, "true": True, "on": True, "yes": True}

_state: dict[str, bool | int] = {}
_decided: dict[tuple[str, str, bool], bool] = {}  # ``switch_once``


def _openblas():
    info = _blas.blas_info()
    path = info.get("path")
    if info.get("blas") != "openblas" or not path:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def core_name() -> str:
    """OpenBLAS's kernel set in use, lower case ("cooperlake"); "" for any other BLAS."""
    lib = _openblas()
    try:
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return (lib.openblas_get_corename() or b"").decode().lower()
    except AttributeError:  # (None, or not OpenBLAS after all)
        return ""


def threads() -> int:
    """OpenBLAS's thread count (1 where it cannot be read)."""
    if "threads" not in _state:
        try:
            _state["threads"] = max(1, int(_openblas().openblas_get_num_threads()))
        except (AttributeError, TypeError, ValueError):
            _state["threads"] = 1
    return _state["threads"]


def env_switch(env: str, otherwise: str = "deciding by the BLAS") -> bool | None:
    """The environment variable ``env`` as an on/off switch (0/1, off/on, no/yes,
    false/true); None when unset, blank or malformed (a malformed value is logged, saying
    what decides ``otherwise``)."""
    value = os.environ.get(env, "").strip().lower()
    if value and value not in _SWITCH:
        log.warning("%s=%r is not 0 or 1; %s", env, value, otherwise)
    return _SWITCH.get(value)


def switch_once(env: str, default: bool, otherwise: str) -> bool:
    """``env_switch(env, otherwise)``, else ``default``: decided once per (variable, its value,
    default), for switches asked on hot paths (a malformed value warns once, and a changed
    value still takes effect)."""
    key = (env, os.environ.get(env, ""), default)
    if key not in _decided:
        value = env_switch(env, otherwise)
        _decided[key] = default if value is None else value
    return _decided[key]


def _switch(env: str, key: str, default) -> bool:
    """``_state[key]``: the environment variable ``env`` where it is a switch, else
    ``default()``, decided once per process."""
    if key not in _state:
        value = env_switch(env)
        _state[key] = bool(default()) if value is None else value
        log.debug("%s: %s", key, _state[key])
    return bool(_state[key])


def enabled() -> bool:
    """Whether products run in blocks here: the environment, else an OpenBLAS whose core has
    the small kernel, computing on the CPU."""
    return _switch(ENV, "on", lambda: mx.default_device() == mx.cpu
                   and core_name() in SMALL_KERNEL_CORES)


def columns_enabled() -> bool:
    """Whether plain weights are kept column-major here: never with the block products (they
    read rows); else the environment, else an OpenBLAS without the small kernel, on the CPU."""
    if enabled():
        return False
    return _switch(COLUMNS_ENV, "columns", lambda: mx.default_device() == mx.cpu
                   and core_name() not in ("", *SMALL_KERNEL_CORES))


def column_major(weight: mx.array) -> mx.array:
    """``weight`` (same shape and values) as a transposed view of its transpose stored
    contiguously, so that ``x @ weight.T`` reads a row-major right operand."""
    return mx.contiguous(weight.T).T


def laid_out(weight: mx.array) -> mx.array:
    """``weight`` as this BLAS multiplies it fastest: column-major for a float32 weight where
    ``columns_enabled()``, else as it is (bfloat16 and float16 products do not go through
    ``sgemm``: the layout measured the same, so a load does not pay for a copy)."""
    if weight.dtype == mx.float32 and columns_enabled():
        return column_major(weight)
    return weight


def _permitted(rows: int, cols: int, inner: int) -> bool:
    """Whether OpenBLAS's permit gives this product (whole) to the small kernel."""
    return rows * cols <= MAX_RN and rows * cols * inner <= MAX_RNK and inner >= 32


def block_width(rows: int, cols: int, inner: int) -> int | None:
    """Columns per block for ``rows`` input rows and a [cols, inner] weight; None: whole."""
    if rows > MAX_ROWS or inner < 32:
        return None
    if threads() > 2 and rows * cols * inner > SERIAL_MNK:
        return None  # the packed product runs on several threads; the small kernel on one
    if _permitted(rows, cols, inner):
        return None  # the whole product already takes the small kernel
    width = min(MAX_RN // rows, MAX_RNK // (rows * inner))
    width = 1 << (width.bit_length() - 1) if width > 0 else 0
    return width if width and width * inner >= MIN_BLOCK_WORK else None


def small_kernel(rows: int, cols: int, inner: int) -> bool:
    """Whether ``product`` computes every output with the small kernel (in blocks or whole):
    then a row's result is the same bits at any such row count."""
    return _permitted(rows, cols, inner) or block_width(rows, cols, inner) is not None


def product(x: mx.array, weight: mx.array) -> mx.array:
    """``x @ weight.T`` in column blocks where ``block_width`` says so: one batched product
    over the weight viewed as [blocks, width, inner] (MLX calls ``sgemm`` once per block, and
    the graph has one node, not one per block), the columns past the last whole block after."""
    cols, inner = weight.shape
    lead = x.shape[:-1]
    rows = math.prod(lead)
    width = block_width(rows, cols, inner)
    if width is None:
        return x @ weight.T
    n = cols // width
    whole = weight if n * width == cols else weight[:n * width]
    blocks = whole.reshape(n, width, inner).swapaxes(1, 2)
    y = x.reshape(1, rows, inner) @ blocks  # [n, rows, width]
    if rows > 1:  # (each view is a graph node MLX dispatches: as few as the shape allows)
        y = y.swapaxes(0, 1)
    if n * width == cols:
        return y.reshape(*lead, cols)
    rest = x.reshape(rows, inner) @ weight[n * width:].T
    return mx.concatenate([y.reshape(rows, n * width), rest], axis=-1).reshape(*lead, cols)


class BlockLinear(nn.Linear):
    def __call__(self, x: mx.array) -> mx.array:
        y = product(x, self["weight"])
        return y + self["bias"] if "bias" in self else y


class BlockEmbedding(nn.Embedding):
    def as_linear(self, x: mx.array) -> mx.array:
        return product(x, self.weight)


class ColumnEmbedding(nn.Embedding):
    """A tied LM head whose product reads a column-major copy of the rows (``_columns``: not a
    parameter, so the lookup and whatever reads ``weight`` see the rows as before)."""

    def as_linear(self, x: mx.array) -> mx.array:
        return x @ self._columns


def adopt(module: nn.Module, head: nn.Module | None = None) -> int:
    """Lay ``module``'s plain Linear and Embedding layers out for this BLAS, same weights and
    same parameters: the block products where ``enabled()``, else column-major weights where
    ``columns_enabled()`` (float32 weights; of the Embeddings, only ``head``, a tied LM head:
    the others are only looked up). Returns how many layers changed."""
    if enabled():
        n = 0
        for _name, m in module.named_modules():
            if type(m) is nn.Linear:
                m.__class__ = BlockLinear
                n += 1
            elif type(m) is nn.Embedding:
                m.__class__ = BlockEmbedding
                n += 1
        return n
    return _adopt_columns(module, head) if columns_enabled() else 0


def _adopt_columns(module: nn.Module, head: nn.Module | None) -> int:
    n = 0
    for _name, m in module.named_modules():
        w = m.get("weight") if type(m) in (nn.Linear, nn.Embedding) else None
        if w is None or w.dtype != mx.float32:  # (see ``laid_out``)
            continue
        if type(m) is nn.Linear:
            m.weight = column_major(w)
            n += 1
        elif m is head and w.nbytes <= TIED_COPY_MAX:
            m._columns = mx.contiguous(w.T)
            m.__class__ = ColumnEmbedding
            n += 1
    return n


def copies(module: nn.Module) -> list[mx.array]:
    """The column-major head copies ``adopt`` made in ``module`` (not parameters: a loader
    evaluates them with the weights)."""
    return [m._columns for _name, m in module.named_modules() if type(m) is ColumnEmbedding]
