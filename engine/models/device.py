"""The one switch that picks the code the trunk and MTP forwards run: ``"cpu"`` or ``"metal"``.

``branch()`` is, in order: what ``set_branch`` / ``use_branch`` forced (tests), else the
environment variable ``MTPCHAT_DEVICE_BRANCH`` (``cpu`` or ``metal``; read once, on the first
call, and again by ``reload_env()``), else ``"cpu"`` when ``mx.default_device()`` is the CPU and
``"metal"`` otherwise. engine/models/trunk.py and engine/models/mtp.py read it once per forward
(``forward_hidden``, ``MTPHead.__call__``) and pass it down; their per-layer functions read it
themselves only when called on their own (tests). Nothing else in the engine depends on it.

What differs, in the forwards that capture (a verify) or run one token per row (a decode
step), and in a prefill chunk's GDN recurrence; the rest of a prefill chunk runs mlx-lm's
decoder layers unchanged on both branches:

======================  ==========================================  ==========================
code                    ``"cpu"``                                   ``"metal"``
======================  ==========================================  ==========================
GDN decoder layer       ``trunk.linear_layer``: the whole layer     ``_gdn_capture`` then the
(dense MLP, caches set) (input norm, ``_gdn_capture``, MLP half)    MLP half, uncompiled
                        as one ``mx.compile``d function per input
                        shape (``layer._mtpchat_layer``)
GDN layer, MoE MLP      ``_gdn_capture`` compiled per shape         both uncompiled
                        (``linear_attn._mtpchat_capture``), the
                        MoE half as mlx-lm runs it
GDN layer, caches unset ``_gdn_capture`` uncompiled, a dense MLP    both uncompiled
(a first forward)       half compiled (``_mtpchat_mlp``)
GDN recurrence          gates (``compute_g``, ``sigmoid(b)``) once  mlx-lm's
(``_recurrence_steps``) for all S tokens, q/k repeated to the       ``gated_delta_update`` one
                        value heads once, each input split once,    token at a time
                        then mlx-lm's ``_gated_delta_step_ops``     (``use_kernel=True``)
                        value for value, a step in 3 graph nodes
                        (``_split_steps``)
GDN recurrence of a     ``gdn_chunked``: 32 tokens at a time        mlx-lm's layer (its kernel,
prompt chunk (>= 8      (WY form), the depthwise conv as four       or its ops one token at a
tokens, no padding)     multiply-adds; equal to rounding            time)
attention decoder layer ``trunk.attention_layer``: norm,            mlx-lm's attention call
(trunk and MTP head)    projections, q/k norms, RoPE (one table     and the MLP half as mlx-lm
                        for q and k, ``rotated``) as one compiled   runs them, uncompiled
                        function (``_mtpchat_attn_in``),
                        cache update as mlx-lm runs it, attention
                        with the query heads folded onto their
                        key/value heads and a softmax with its
                        own exponential (``cpu_attention``; equal
                        to rounding), then gate, ``o_proj``,
                        residual and a dense MLP compiled
                        (``_mtpchat_attn_out``)
MLP half alone          compiled per layer (``_mtpchat_mlp``)       uncompiled
MTP ``fc`` input        two norms, concat, ``fc`` compiled          uncompiled
                        (``head._mtpchat_fc``)
MTP head's final norm   compiled (``head._mtpchat_norm``)           uncompiled
======================  ==========================================  ==========================

On the CPU branch the trunk's layers are one share group (``trunk.share_compiled``, set by
``forward_hidden``): each compiled function above is traced once per input shape for all the
model's layers of the same structure and replayed on each layer's own weights (a fresh
process's first burst of streams meets a dozen new shapes; it traced each once per layer).

``gated_delta_update`` runs mlx-lm's Metal kernel only when the default device is the GPU and
Metal is available (and the key head dim is a multiple of 32); anywhere else -- the CPU, an
MLX GPU without Metal -- it falls back by itself to ``gated_delta_ops``, the same
``_gated_delta_step_ops`` the CPU branch runs op for op, with the gates computed per token. So
on a CPU ``"metal"`` runs the non-CPU code path with ops instead of the kernel, and gives the CPU
branch's results (the GDN parts bit for bit, the attention to float rounding, on the test
models, tests/engine/models/test_device_branch.py): the exactness tests run on both branches
there (tests/engine/conftest.py). Forcing ``"cpu"`` on a
GPU runs the compiled functions on the GPU; they are traced on the device in use when first
called, so switch devices only before a model's first forward.

The compiled functions are kept on the layers (``compiled_on``); they are made and called
only on the ``"cpu"`` branch, so switching branch mid-process switches the code that runs
from the next forward on, on the same model.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import mlx.core as mx

ENV_VAR = "MTPCHAT_DEVICE_BRANCH"
BRANCHES = ("cpu", "metal")

_UNREAD = object()
_forced: str | None = None
_env: object = _UNREAD


def _valid(name: str, where: str) -> str:
    if name not in BRANCHES:
        raise ValueError(f"{where} = {name!r}: the device branch is one of "
                         f"{', '.join(BRANCHES)}")
    return name


def reload_env() -> str | None:
    """Re-read ``MTPCHAT_DEVICE_BRANCH`` (empty or unset: none); return what it now says."""
    global _env
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    _env = _valid(raw, ENV_VAR) if raw else None
    return _env


def branch() -> str:
    """``"cpu"`` or ``"metal"``: forced, else the environment, else the default device."""
    if _forced is not None:
        return _forced
    env = reload_env() if _env is _UNREAD else _env
    if env is not None:
        return env
    return "cpu" if mx.default_device() == mx.cpu else "metal"


def is_cpu() -> bool:
    """Whether the forwards run the CPU branch (the compiled per-layer functions)."""
    return branch() == "cpu"


def set_branch(name: str | None) -> str | None:
    """Force the branch (``None``: back to the environment / device); return the previous
    forced value. Process-wide (every thread), read by the next forward."""
    global _forced
    previous = _forced
    _forced = None if name is None else _valid(name, "set_branch")
    return previous


@contextlib.contextmanager
def use_branch(name: str | None) -> Iterator[str]:
    """``with use_branch("metal"): ...`` runs the forwards inside on that branch."""
    previous = set_branch(name)
    try:
        yield branch()
    finally:
        set_branch(previous)
