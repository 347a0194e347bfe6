"""Trunk forwards on mlx-lm's Qwen3.5 classes: hidden states, logits, and a verify forward
that captures the Gated DeltaNet state after every step so a rejection never re-runs it.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import (create_attention_mask, create_ssm_mask,
                                scaled_dot_product_attention)
from mlx_lm.models.qwen3_5 import gather_last_axis
from mlx_lm.models.qwen3_next import Qwen3NextRMSNormGated

from engine.models import cpu_attention, cpu_math, device, gdn_chunked

# The capture forward must run the same arithmetic as mlx-lm's own GatedDeltaNet (that is
# what plain decoding runs), so it shares these helpers with it. Some are private to mlx-lm
# (``normalize_qk``, ``_gated_delta_step_ops``; its main branch no longer defines them), so
# pyproject.toml bounds mlx-lm to the tested series and this is the one place they are read.
MLX_LM_TESTED = ">=0.32.2,<0.33"
GATED_DELTA_HELPERS = ("compute_g", "gated_delta_update", "normalize_qk",
                       "_gated_delta_step_ops")


def _gated_delta_helpers(module=None) -> tuple:
    """The helpers from ``mlx_lm.models.gated_delta``, or an ImportError saying which moved."""
    if module is None:
        from mlx_lm.models import gated_delta as module
    missing = [n for n in GATED_DELTA_HELPERS if not hasattr(module, n)]
    if missing:
        from importlib.metadata import version

        raise ImportError(
            f"mlx-lm {version('mlx-lm')} no longer defines {', '.join(missing)} in "
            f"mlx_lm.models.gated_delta; MTP Chat's verify forward needs mlx-lm{MLX_LM_TESTED} "
            f"(pip install 'mlx-lm{MLX_LM_TESTED}').")
    return tuple(getattr(module, n) for n in GATED_DELTA_HELPERS)


compute_g, gated_delta_update, normalize_qk, _step_ops = _gated_delta_helpers()


@dataclass
class GDNCapture:
    """Per-step states of one GDN layer during a verify forward (index j = after step j)."""

    conv: list[mx.array]
    state: list[mx.array]


def lm_head(text_model, h: mx.array) -> mx.array:
    """The trunk's LM head (tied to ``embed_tokens`` or separate); shared with the MTP head.
    A separate head split across ranks by mlx-lm's ``shard`` (each rank a slice of the
    vocabulary) is gathered back to the whole vocabulary, as mlx-lm's own forward does."""
    if text_model.args.tie_word_embeddings:
        return text_model.model.embed_tokens.as_linear(h)
    group = getattr(text_model, "sharding_group", None)
    out = text_model.lm_head(h)
    return out if group is None else gather_last_axis(out, group)


def _cpu(cpu: bool | None) -> bool:
    """``cpu`` as passed down by a forward, else the device branch (engine/models/device.py)."""
    return device.is_cpu() if cpu is None else cpu


def _recurrence_steps(gdn, q, k, v, a, b, state, cpu: bool | None = None,
                      ) -> tuple[mx.array, list[mx.array]]:
    """The gated delta rule one step at a time, keeping every state: (out [B, S, H, Dv], the
    state after each step). On the "metal" branch each step is mlx-lm's
    ``gated_delta_update`` (its kernel on a Metal GPU, else its ops fallback); on the "cpu"
    branch gates are computed once and each step is mlx-lm's compiled step op (the same
    arithmetic plain decoding runs)."""
    S = q.shape[1]
    outs, states = [], []
    if not _cpu(cpu):
        for j in range(S):
            o, state = gated_delta_update(
                q[:, j:j + 1], k[:, j:j + 1], v[:, j:j + 1], a[:, j:j + 1], b[:, j:j + 1],
                gdn.A_log, gdn.dt_bias, state, None, use_kernel=True)
            outs.append(o)
            states.append(state)
        return _joined(outs), states
    beta = mx.sigmoid(b)
    g = compute_g(gdn.A_log, a, gdn.dt_bias)
    if state is None:
        B, _, Hv, Dv = v.shape
        state = mx.zeros((B, Hv, Dv, q.shape[-1]), dtype=mx.float32)
    rep = v.shape[-2] // q.shape[-2]
    if rep > 1:
        q, k = mx.repeat(q, rep, -2), mx.repeat(k, rep, -2)
    if g.ndim == 3:  # one gate a head (Qwen3.5)
        return _split_steps(q, k, v, g, beta, state)
    for j in range(S):
        y, state = _step_ops(q[:, j], k[:, j], v[:, j], g[:, j], beta[:, j], state, None)
        outs.append(y[:, None])
        states.append(state)
    return _joined(outs), states


def _joined(outs: list[mx.array]) -> mx.array:
    return mx.concatenate(outs, axis=1) if len(outs) > 1 else outs[0]


def _split_steps(q, k, v, g, beta, state) -> tuple[mx.array, list[mx.array]]:
    """``_step_ops``'s arithmetic over S steps, value for value (so the same bits: tested),
    in fewer graph nodes. MLX evaluates every node, a view included, at a few microseconds
    on the CPU however little it computes (a 4-token verify forward of the demo had 1,380
    nodes against 728 for one token), so:
    - the inputs are split once with the step axis kept and broadcast (no slice, squeeze
      and expand per step);
    - a step is two fused kernels and a sum: ``(state * g) * k`` summed to ``kv_mem``, then
      ``g * state + k * ((v - kv_mem) * beta)``, the decay recomputed in the second kernel
      (IEEE products commute, and the operands are written in another order so the compiler
      does not merge the two decays into one stored array);
    - the outputs ``(state * q).sum(-1)`` of all S steps are one product and one sum over
      the concatenated states, for states up to ``BATCHED_OUTPUT_MAX`` elements.
    q, k: [B, S, H, Dk] (repeated to v's heads), v: [B, S, H, Dv], g and beta: [B, S, H],
    state: [B, H, Dv, Dk] (float32) -> (out [B, S, H, Dv] in q's dtype, the S states)."""
    S = q.shape[1]
    parts = (g[..., None, None], k[..., None, :], v[..., None], beta[..., None, None])
    gs, ks, vs, bs = (mx.split(p, S, axis=1) if S > 1 else [p] for p in parts)
    state = state[:, None]  # [B, 1, H, Dv, Dk]
    kept = []
    for j in range(S):
        kv_mem = (state * gs[j] * ks[j]).sum(axis=-1, keepdims=True)
        state = gs[j] * state + ks[j] * ((vs[j] - kv_mem) * bs[j])
        kept.append(state)
    if S == 1 or state.size <= BATCHED_OUTPUT_MAX:
        out = (_joined(kept) * q[..., None, :]).sum(axis=-1)
    else:  # large states: a copy of all S would cost more than the nodes it saves
        qs = mx.split(q[..., None, :], S, axis=1)
        out = _joined([(s * qs[j]).sum(axis=-1) for j, s in enumerate(kept)])
    return out.astype(q.dtype), [s.squeeze(1) for s in kept]


# State elements (rows x heads x Dv x Dk) up to which ``_split_steps`` computes every step's
# output from one concatenation of the states: the demo's 8 x 32 x 32 at up to 8 rows. Past
# it (Qwen3.5-0.8B's 16 x 128 x 128 is 262,144 a row) copying S states costs more than the
# 2(S-1) graph nodes it saves: 3.76 against 3.16 ms a layer for 4 steps, measured.
BATCHED_OUTPUT_MAX = 65536


def split_projections(gdn, x: mx.array) -> tuple[mx.array, ...]:
    """Qwen3.5's separate input projections -> (mixed q|k|v [B, S, conv_dim], z [B, S, Hv,
    Dv], b [B, S, Hv], a [B, S, Hv]): what the conv and the recurrence read. A family whose
    GDN fuses them (Qwen3-Next) passes its own function of the same shape to the forward."""
    B, S, _ = x.shape
    qkv = gdn.in_proj_qkv(x)
    z = gdn.in_proj_z(x).reshape(B, S, gdn.num_v_heads, gdn.head_v_dim)
    return qkv, z, gdn.in_proj_b(x), gdn.in_proj_a(x)


def _gdn_capture(gdn, x: mx.array, cache, cpu: bool | None = None,
                 project=split_projections) -> tuple[mx.array, GDNCapture]:
    """GatedDeltaNet forward over S tokens that keeps the conv window and recurrent state
    after every step. Same math as mlx-lm's layer; the recurrence runs one step at a time.
    ``project`` maps the layer's input to (q|k|v, z, b, a) (``split_projections``)."""
    B, S, _ = x.shape
    conv_input, q, k, v, z, b, a = _gdn_inputs(gdn, x, cache[0], project)
    n_keep = gdn.conv_kernel_size - 1
    convs = [conv_input[:, j + 1: j + 1 + n_keep, :] for j in range(S)]
    out, states = _recurrence_steps(gdn, q, k, v, a, b, cache[1], cpu)
    cache[0], cache[1] = convs[-1], states[-1]
    return _gdn_out(gdn, out, z), GDNCapture(conv=convs, state=states)


def _gdn_inputs(gdn, x: mx.array, conv_state, project, conv=None,
                mask: mx.array | None = None, fast: bool = False) -> tuple[mx.array, ...]:
    """(conv input, q, k, v, z, b, a) of a GatedDeltaNet over ``x`` [B, S, D]: mlx-lm's
    projections, causal conv (after ``conv_state``, zeros when None; ``conv``: instead of the
    layer's ``conv1d``) and q/k normalisation. ``mask`` [B, S] (False: a left-padding
    position): the conv reads zeros there, as mlx-lm's layer does. ``fast``: the SiLU of
    ``cpu_math`` (a prefill's large arrays)."""
    B, S, _ = x.shape
    qkv, z, b, a = project(gdn, x)
    if mask is not None:
        qkv = mx.where(mask[..., None], qkv, 0)
    n_keep = gdn.conv_kernel_size - 1
    if conv_state is None:
        conv_state = mx.zeros((B, n_keep, gdn.conv_dim), x.dtype)
    conv_input = mx.concatenate([conv_state, qkv], axis=1)
    conv_out = (cpu_math.silu if fast else nn.silu)((conv or gdn.conv1d)(conv_input))
    q, k, v = [
        t.reshape(B, S, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [gdn.key_dim, 2 * gdn.key_dim], -1),
            [gdn.num_k_heads, gdn.num_k_heads, gdn.num_v_heads],
            [gdn.head_k_dim, gdn.head_k_dim, gdn.head_v_dim],
        )
    ]
    q, k = normalize_qk(q, k, inv_scale=gdn.head_k_dim ** -0.5, eps=1e-6)
    return conv_input, q, k, v, z, b, a


def _gdn_out(gdn, out: mx.array, z: mx.array, fast: bool = False) -> mx.array:
    """The gated norm and output projection (summed over ranks under tensor parallelism).
    ``fast``: mlx-lm's gated norm with ``cpu_math``'s SiLU (a prefill's large arrays)."""
    B, S = out.shape[:2]
    norm = gdn.norm
    if fast and isinstance(norm, Qwen3NextRMSNormGated):
        y = mx.fast.rms_norm(out, norm.weight, norm.eps)
        y = (cpu_math.silu(z.astype(mx.float32)) * y.astype(mx.float32)).astype(out.dtype)
    else:
        y = norm(out, z)
    out = gdn.out_proj(y.reshape(B, S, -1))
    group = getattr(gdn, "sharding_group", None)  # tensor parallel: this rank's heads' part
    if group is not None:
        out = mx.distributed.all_sum(out, group=group)
    return out


def gdn_prefill(gdn, x: mx.array, cache, project=split_projections, mark: int | None = None,
                mask: mx.array | None = None) -> tuple[mx.array, GDNCapture | None]:
    """A GatedDeltaNet over a prompt chunk ``x`` [B, S, D] with its recurrence in chunks
    (``gdn_chunked``; mlx-lm's layer runs it one token at a time off Metal); leaves the cache
    as mlx-lm's layer does (the last conv window, the final state). With ``mark`` (0 < mark <
    S) the recurrence runs in two parts split there, and the layer's state after ``mark``
    tokens comes back too (a one-step ``GDNCapture``); else None. ``mask`` [B, S] (False:
    left padding, ``engine.decoding.together``): a padded position feeds the conv zeros (what
    a fresh row's conv window holds) and leaves the recurrent state as it was (no decay, no
    update), so a fresh row ends with its own tokens' state."""
    conv_input, q, k, v, z, b, a = _gdn_inputs(gdn, x, cache[0], project,
                                               functools.partial(gdn_chunked.depthwise_conv,
                                                                 gdn.conv1d), mask, fast=True)
    log_g, beta = gdn_chunked.log_decay(gdn.A_log, a, gdn.dt_bias), mx.sigmoid(b)
    if mask is not None:
        log_g, beta = mx.where(mask[..., None], log_g, 0), mx.where(mask[..., None], beta, 0)
    n_keep = gdn.conv_kernel_size - 1
    cap = None
    if mark is None:
        out, state = gdn_chunked.chunked_gated_delta(q, k, v, log_g, beta, cache[1])
    else:
        parts = [(q[:, i:j], k[:, i:j], v[:, i:j], log_g[:, i:j], beta[:, i:j])
                 for i, j in ((0, mark), (mark, q.shape[1]))]
        first, mid = gdn_chunked.chunked_gated_delta(*parts[0], cache[1])
        second, state = gdn_chunked.chunked_gated_delta(*parts[1], mid)
        out = mx.concatenate([first, second], axis=1)
        cap = GDNCapture(conv=[mx.contiguous(conv_input[:, mark:mark + n_keep, :])],
                         state=[mid])
    cache[0] = mx.contiguous(conv_input[:, -n_keep:, :])
    cache[1] = state
    return _gdn_out(gdn, out, z, fast=True), cap


def _gdn_capture_fused(gdn, x: mx.array, cache, cpu: bool | None = None,
                       project=split_projections) -> tuple[mx.array, GDNCapture]:
    """``_gdn_capture`` as one ``mx.compile``d function per layer and input shape on the CPU
    branch (``cpu``: as the forward read it; None: read the switch) (the same operations
    fused: bit-identical, tested for one row and a batch's; depth 2-3
    replies on the demo model 3-9 % faster in alternating runs, where dispatching ~50 small
    operations a layer costs more than their arithmetic; a whole demo verify forward over
    2-8 rows x 2-4 tokens 3-8 % faster). A new shape (rows, tokens) compiles once: ~40-90 ms
    on top of the ~300-500 ms mlx-lm's own compiled step takes for it. The compiled functions
    live on the layer itself, so they go with the model."""
    cpu = _cpu(cpu)
    if not cpu or cache[0] is None or cache[1] is None:
        return _gdn_capture(gdn, x, cache, cpu, project)
    return _compiled_captured(gdn, "_mtpchat_capture",
                              functools.partial(_gdn_capture, gdn, cpu=True, project=project),
                              x, cache)


class _Shared:
    """One ``mx.compile``d function that every module of a share group with the same compile
    inputs' structure calls (``share_compiled``): ``inputs`` holds the calling module's
    weights and ``fn`` its bound function, set before each call. MLX reads ``inputs`` at every
    call and swaps tracers into it while tracing, so a trace made on one layer is replayed on
    the next layer's own weights: a new input shape is traced once per model, not once per
    layer (a GDN layer's trace is 0.6-1.3 ms on the demo, its replay 0.06-0.15 ms)."""

    __slots__ = ("inputs", "fn", "compiled", "lock")

    def __init__(self, body) -> None:
        self.inputs: list = [None]
        self.fn = None
        self.compiled = mx.compile(body, inputs=self.inputs)
        self.lock = threading.Lock()  # a model is decoded by one thread, but never mix two

    def __call__(self, fn, inputs, *args):
        with self.lock:
            self.inputs[0], self.fn = inputs, fn
            return self.compiled(*args)


def share_compiled(modules, group: dict | None = None) -> dict:
    """Put ``modules`` (a model's decoder layers, with their GDN modules) in one share group:
    their compiled functions (``compiled_on``, ``_compiled_captured``) are traced once per
    input shape for all modules whose compile inputs have the same structure (names, shapes,
    dtypes). A group never spans two models (their constants, norms' eps or RoPE's base, are
    traced in), so each model gets its own. Modules outside a group compile on their own."""
    group = {} if group is None else group
    for m in modules:
        m.__dict__["_mtpchat_group"] = group
        sub = getattr(m, "linear_attn", None)
        if sub is not None:
            sub.__dict__["_mtpchat_group"] = group
    return group


def _signature(inputs) -> tuple:
    from mlx.utils import tree_flatten

    return tuple((k, v.shape, v.dtype) for k, v in tree_flatten(inputs)
                 if isinstance(v, mx.array))


def _compiled_captured(module, name: str, run, x: mx.array, cache,
                       ) -> tuple[mx.array, GDNCapture]:
    """``run(x, [conv, state]) -> (out, GDNCapture)`` as one ``mx.compile``d function per
    input shape, kept on ``module`` under ``name`` (in a share group: one table shared by the
    group's modules of the same structure, ``share_compiled``); sets ``cache`` to the last
    step's states. The module's weights are compile inputs, not constants: a model whose
    weights change in place (training, a reload into the same modules) is never run with
    stale ones."""
    fns = module.__dict__.get(name)
    if fns is None:
        group = module.__dict__.get("_mtpchat_group")
        fns = {} if group is None else group.setdefault((name, _signature(module.state)), {})
        module.__dict__[name] = fns
    key = (x.shape, x.dtype, cache[0].shape, cache[1].shape)
    fn = fns.get(key)
    if fn is None:
        if len(fns) >= 64:  # shapes come from batch sizes and depths: a handful in practice
            fns.clear()
        fn = fns[key] = _captured()
    res = fn(run, module.state, x, cache[0], cache[1])
    S = x.shape[1]
    capture = GDNCapture(conv=list(res[1:1 + S]), state=list(res[1 + S:]))
    cache[0], cache[1] = capture.conv[-1], capture.state[-1]
    return res[0], capture


def _captured() -> _Shared:
    """A shared compiled ``run(x, [conv, state])`` flattened to (out, *convs, *states)."""
    holder: list = []

    def body(x, conv, state):
        out, cap = holder[0].fn(x, [conv, state])
        return (out, *cap.conv, *cap.state)
    shared = _Shared(body)
    holder.append(shared)
    return shared


def compiled_on(module, name: str, fn, inputs):
    """``mx.compile(fn, inputs=inputs)``, made once and kept on ``module`` under ``name`` (so it
    goes with the model); in a share group (``share_compiled``) one compiled function serves
    every module whose ``inputs`` have the same structure, each call on the caller's own.
    ``inputs`` are the module's weights: compile inputs, not constants, so weights changed in
    place are the ones used."""
    got = module.__dict__.get(name)
    if got is None:
        group = module.__dict__.get("_mtpchat_group")
        if group is None:
            got = mx.compile(fn, inputs=inputs)
        else:
            key = (name, _signature(inputs))
            shared = group.get(key)
            if shared is None:
                shared = group[key] = _shared_plain()
            got = functools.partial(shared, fn, inputs)
        module.__dict__[name] = got
    return got


def _shared_plain() -> _Shared:
    """A shared compiled ``fn(*args)``."""
    holder: list = []

    def body(*args):
        return holder[0].fn(*args)
    shared = _Shared(body)
    holder.append(shared)
    return shared


def mlp_block(layer, h: mx.array, cpu: bool | None = None, prefill: bool = False) -> mx.array:
    """A decoder layer's second half, ``h + mlp(post_attention_layernorm(h))``, as one
    ``mx.compile``d function per layer on the CPU branch for a dense MLP (the same operations:
    bit-identical to mlx-lm's layer, tested; MoE blocks run as they are). ``prefill`` (a
    prompt chunk): its SiLU is ``cpu_math``'s."""
    if not _cpu(cpu) or not hasattr(layer.mlp, "gate_proj"):
        return h + layer.mlp(layer.post_attention_layernorm(h))
    if prefill:
        mlp = layer.mlp

        def fast(h):
            y = layer.post_attention_layernorm(h)
            return h + mlp.down_proj(cpu_math.silu(mlp.gate_proj(y)) * mlp.up_proj(y))
        return compiled_on(layer, "_mtpchat_mlp_prefill", fast,
                           [layer.mlp.state, layer.post_attention_layernorm.state])(h)

    def half(h):
        return h + layer.mlp(layer.post_attention_layernorm(h))
    return compiled_on(layer, "_mtpchat_mlp", half,
                       [layer.mlp.state, layer.post_attention_layernorm.state])(h)


def shifted_offset(cache):
    """The cache's RoPE offset moved by its M-RoPE shift (``rope_delta``: an int on a
    stream's cache, one per row on a batch's), or None when there is none: text past an
    image sits at fewer positions than tokens (``engine.vision.positions``). Text-only
    conversations never set it, so their arithmetic is untouched."""
    delta = getattr(cache, "rope_delta", 0)
    if isinstance(delta, list):
        if not any(delta):
            return None
        return cache.offset + mx.array(delta, dtype=mx.int32)
    if not delta:
        return None
    return mx.array(cache.offset + delta, dtype=mx.int32)


def attention_layer(layer, x: mx.array, mask, cache, cpu: bool | None = None,
                    at: mx.array | None = None) -> mx.array:
    """A full-attention decoder layer, ``h + mlp(post_attention_layernorm(h))`` with
    ``h = x + self_attn(input_layernorm(x))``, with mlx-lm's operations. On the CPU branch
    (``cpu``: as the forward read it; None: read the switch) the norm,
    the projections, the q/k norms and RoPE run as one ``mx.compile``d function (the RoPE
    offset passed as an array: the same values as an int offset, tested), then the cache
    update as mlx-lm runs it and the attention with the query heads folded onto their
    key/value heads (``cpu_attention``; mlx-lm's call elsewhere and for a quantized cache;
    their shapes grow with the context, so they are not compiled), then the output gate, ``o_proj``, the residual and (a dense
    MLP) the layer's second half as another compiled function. A cache shifted by M-RoPE
    (``shifted_offset``) runs these same parts on every device, rotating at the shifted
    offset (uncompiled off the CPU branch).

    ``at`` [B]: only that position's output is wanted in each row ([B, 1, H] returned): every
    position's keys and values still enter the cache, but the attention, the gate, ``o_proj``
    and the MLP run for that position alone (an MTP step 1 runs the pairs committed since the
    last draft ahead of the pair it drafts from; their outputs were computed and dropped,
    one query row each over the whole context)."""
    attn = layer.self_attn
    cpu = _cpu(cpu)
    shifted = None if cache is None else shifted_offset(cache)
    if (not cpu and shifted is None) or cache is None or \
            not isinstance(attn.rope, nn.RoPE) or not hasattr(attn, "q_norm"):
        out = mlp_block(layer, x + attn(layer.input_layernorm(x), mask, cache), cpu)
        return out if at is None else mx.take_along_axis(out, at[:, None, None], axis=1)
    offset = cache.offset if shifted is None else shifted
    if isinstance(offset, int):
        offset = mx.array(offset, dtype=mx.int32)
    if cpu:
        q, k, v, gate = compiled_on(layer, "_mtpchat_attn_in", functools.partial(_attn_in, layer),
                                    [attn.state, layer.input_layernorm.state])(x, offset)
    else:
        q, k, v, gate = _attn_in(layer, x, offset)
    k, v = cache.update_and_fetch(k, v)
    if at is not None:
        q, gate, x, mask = _rows_at(q, gate, x, mask, at, k.shape[2])
    if cpu and not hasattr(cache, "bits"):
        out = cpu_attention.attention(q, k, v, scale=attn.scale, mask=mask)
    else:
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=attn.scale, mask=mask)
    if not cpu or not _dense(layer):
        return mlp_block(layer, attention_out(layer, out, gate, x, mlp=False), cpu)
    return compiled_on(layer, "_mtpchat_attn_out", functools.partial(attention_out, layer),
                       [attn.o_proj.state, layer.mlp.state,
                        layer.post_attention_layernorm.state])(out, gate, x)


def _prefill_attention(layer, x: mx.array, mask, cache, cpu: bool) -> mx.array:
    """An attention layer of a forward that is not one fused step: past an image (shifted
    positions) ``attention_layer``; a long chunk on the CPU ``prefill_attention_layer``; else
    mlx-lm's layer as it is."""
    if shifted_offset(cache) is not None:
        return attention_layer(layer, x, mask, cache, cpu)
    if cpu and host_prefill(layer, cache, x.shape[1]):
        return prefill_attention_layer(layer, x, mask, cache)
    # mlx-lm's decoder layer, its MLP half with ``cpu_math``'s SiLU on the CPU
    h = x + layer.self_attn(layer.input_layernorm(x), mask, cache)
    return mlp_block(layer, h, cpu, prefill=True)


def host_prefill(layer, cache, queries: int) -> bool:
    """Whether a CPU prefill chunk of ``queries`` tokens runs this attention layer as
    ``prefill_attention_layer`` (its scores on the host: ``cpu_attention.host_applies``): a
    Qwen3.5 gated attention with a plain RoPE over a full-precision cache (else mlx-lm's
    layer runs as it is)."""
    attn = layer.self_attn
    if cache is None or hasattr(cache, "bits") or type(attn.rope) is not nn.RoPE \
            or not hasattr(attn, "q_norm"):
        return False
    offset = cache.offset
    keys = (offset if isinstance(offset, int) else int(mx.max(offset).item())) + queries
    return cpu_attention.host_applies(queries, keys)


def prefill_attention_layer(layer, x: mx.array, mask, cache) -> mx.array:
    """mlx-lm's attention decoder layer for a long prefill chunk on the CPU: its operations,
    uncompiled (a chunk's length varies), but for the attention itself, computed on the host
    (``cpu_attention.host_attention``: 4x MLX's at 19k tokens on the demo)."""
    offset = cache.offset
    if isinstance(offset, int):
        offset = mx.array(offset, dtype=mx.int32)
    q, k, v, gate = _attn_in(layer, x, offset)
    k, v = cache.update_and_fetch(k, v)
    out = cpu_attention.host_attention(q, k, v, scale=layer.self_attn.scale, mask=mask)
    return attention_out(layer, out, gate, x)


def _rows_at(q, gate, x, mask, at: mx.array, keys: int) -> tuple:
    """The query, gate and residual of position ``at[b]`` in each row, and its mask row
    (what that query saw among ``keys`` key positions in the whole forward)."""
    L = x.shape[1]
    q = mx.take_along_axis(q, at[:, None, None, None], axis=2)
    gate = mx.take_along_axis(gate, at[:, None, None], axis=1)
    x = mx.take_along_axis(x, at[:, None, None], axis=1)
    if isinstance(mask, mx.array):
        idx = mx.broadcast_to(at[:, None, None, None], (*mask.shape[:2], 1, 1))
        mask = mx.take_along_axis(mask, idx, axis=2)
    elif isinstance(mask, str) or L > 1:  # causal: query j sees keys up to keys - L + j
        mask = (mx.arange(keys)[None] <= (keys - L + at)[:, None])[:, None, None, :]
    return q, gate, x, mask


def _dense(layer) -> bool:
    return hasattr(layer.mlp, "gate_proj")


def attention_inputs(layer, x: mx.array) -> tuple[mx.array, ...]:
    """mlx-lm's attention up to the rotation: queries and keys (normed, [B, heads, L, D],
    not yet rotated), values, the output gate [B, L, heads * D]. The caller rotates
    (``_attn_in``: RoPE at an offset; ``engine.vision.prefill``: M-RoPE positions)."""
    attn = layer.self_attn
    h = layer.input_layernorm(x)
    B, L, _ = h.shape
    q, gate = mx.split(attn.q_proj(h).reshape(B, L, attn.num_attention_heads, -1), 2, axis=-1)
    k = attn.k_norm(attn.k_proj(h).reshape(B, L, attn.num_key_value_heads, -1))
    v = attn.v_proj(h).reshape(B, L, attn.num_key_value_heads, -1).transpose(0, 2, 1, 3)
    return (attn.q_norm(q).transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v,
            gate.reshape(B, L, -1))


def _attn_in(layer, x: mx.array, offset: mx.array) -> tuple[mx.array, ...]:
    """``attention_inputs`` with queries and keys rotated at ``offset``."""
    q, k, v, gate = attention_inputs(layer, x)
    q, k = rotated(layer.self_attn.rope, offset, q, k)
    return q, k, v, gate


def rotated(rope, offset: mx.array, *xs: mx.array) -> list[mx.array]:
    """``rope(x, offset=offset)`` for each of ``xs`` ([B, heads, L, D], the same B and L),
    with one table of cosines and sines: on the CPU ``mx.fast.rope`` is composed of ops, its
    positions, frequencies, cosines and sines built again for every call (7 of its 13 graph
    nodes). The table is built with the same ops, so the values are the same bits (tested);
    a rope other than a plain ``nn.RoPE`` (scaled variants, the traditional layout) or
    another device runs as it is."""
    if type(rope) is not nn.RoPE or rope.traditional or not device.is_cpu() \
            or len({x.dtype for x in xs}) > 1:
        return [rope(x, offset=offset) for x in xs]
    half, L = rope.dims // 2, xs[0].shape[2]
    if offset.size > 1:
        offset = offset[:, None, None]
    positions = (mx.arange(L, dtype=mx.float32) + offset) * mx.array(rope.scale, mx.float32)
    theta = positions[..., None] * mx.exp(
        mx.arange(0, -half, -1, dtype=mx.float32) * _log_base_step(rope.base, half))
    cos, sin = mx.cos(theta).astype(xs[0].dtype), mx.sin(theta).astype(xs[0].dtype)
    out = []
    for x in xs:
        x1, x2 = x[..., :half], x[..., half:rope.dims]
        parts = [x1 * cos - x2 * sin, x1 * sin + x2 * cos]
        if rope.dims < x.shape[-1]:
            parts.append(x[..., rope.dims:])
        out.append(mx.concatenate(parts, axis=-1))
    return out


@functools.lru_cache(maxsize=16)
def _log_base_step(base: float, half: int) -> mx.array:
    """``log(base) / half`` as ``mx.fast.rope`` computes it (in float32: a float's log over
    an int)."""
    step = mx.log(mx.array(base, dtype=mx.float32)) / mx.array(half, dtype=mx.float32)
    mx.eval(step)
    return step


def attention_out(layer, out: mx.array, gate: mx.array, x: mx.array, *,
              mlp: bool = True) -> mx.array:
    """The attention's output through its gate and ``o_proj``, plus ``x``; with ``mlp`` the
    layer's second half on top."""
    B, _, L, _ = out.shape
    out = out.transpose(0, 2, 1, 3).reshape(B, L, -1)
    h = x + layer.self_attn.o_proj(out * mx.sigmoid(gate))
    return h + layer.mlp(layer.post_attention_layernorm(h)) if mlp else h


def linear_layer(layer, x: mx.array, cache, cpu: bool | None = None,
                 project=split_projections) -> tuple[mx.array, GDNCapture]:
    """A Gated DeltaNet decoder layer, ``h + mlp(post_attention_layernorm(h))`` with
    ``h = x + linear_attn(input_layernorm(x))``, keeping the conv window and recurrent state
    after every step (``_gdn_capture``). On the CPU branch (``cpu``: as the forward read it;
    None: read the switch), with a dense MLP and both caches set,
    the whole layer is one ``mx.compile``d function per input shape (the same operations as
    mlx-lm's layer, bit for bit: tested); else its GDN part (``_gdn_capture_fused``) and its
    MLP half (``mlp_block``) run apart."""
    gdn = layer.linear_attn
    cpu = _cpu(cpu)
    if not cpu or cache[0] is None or cache[1] is None or not _dense(layer):
        r, cap = _gdn_capture_fused(gdn, layer.input_layernorm(x), cache, cpu, project)
        return mlp_block(layer, x + r, cpu), cap

    def whole(x, caches):
        out, cap = _gdn_capture(gdn, layer.input_layernorm(x), caches, True, project)
        h = x + out
        return h + layer.mlp(layer.post_attention_layernorm(h)), cap
    return _compiled_captured(layer, "_mtpchat_layer", whole, x, cache)


# A prompt chunk of at least this many tokens runs its GDN recurrence in chunks on the CPU
# branch (``gdn_prefill``); shorter ones (a few tokens after a prompt-cache hit) step.
CHUNKED_PREFILL_MIN = 8


def linear_prefill(layer, x: mx.array, cache, cpu: bool | None = None,
                   project=split_projections, mark: int | None = None,
                   mask: mx.array | None = None) -> tuple[mx.array, GDNCapture | None]:
    """mlx-lm's GDN decoder layer over a prompt chunk, its recurrence chunked (``gdn_prefill``;
    ``mark``: its state there too; ``mask``: left padding)."""
    out, cap = gdn_prefill(layer.linear_attn, layer.input_layernorm(x), cache, project, mark,
                           mask)
    return mlp_block(layer, x + out, cpu, prefill=True), cap


def marks(tokens: int) -> bool:
    """Whether ``forward_hidden`` can return the state inside a prompt chunk of this many
    tokens (``mark``): the CPU branch's chunked prefill (a prompt with images never asks)."""
    return device.is_cpu() and tokens >= CHUNKED_PREFILL_MIN


def _check_mark(mark: int | None, chunked: bool, tokens: int) -> None:
    if mark is not None and not (chunked and 0 < mark < tokens):
        raise ValueError(f"no state at {mark} of {tokens} tokens here: see marks()")


def forward_hidden(text_model, inputs: mx.array, cache: list, *, capture: bool = False,
                   project=split_projections, mark: int | None = None,
                   ) -> tuple[mx.array, dict[int, GDNCapture]]:
    """Run the trunk on ``inputs`` [B, S]; return (hidden after the final norm, captures).
    ``mark`` (0 < mark < S, where ``marks`` holds): the captures are each GDN layer's state
    after ``mark`` tokens (one step); the attention layers' state there is their prefix.

    With ``capture`` the GDN layers record their per-step states (keyed by layer index);
    the attention layers append to their KV caches as usual (trimmed by the caller). With
    ``capture`` or one token per row (a decode step), each layer runs as mlx-lm's decoder
    layer does, on the CPU branch compiled: a GDN layer whole (``linear_layer``), an attention layer in two
    parts around its cache update (``attention_layer``); a prefill chunk runs mlx-lm's
    layers, but on the CPU branch its GDN recurrence in chunks (``linear_prefill``, from
    ``CHUNKED_PREFILL_MIN`` tokens; left-padded rows too: ``engine.decoding.together``) and
    its SiLUs fused (``cpu_math``). The device branch (engine/models/device.py) is read once.
    ``project``: the GDN layers' input projections (``split_projections``: Qwen3.5's).

    Split across machines by mlx-lm (``engine.distributed.family``): tensor parallel needs
    nothing here (mlx-lm's sharded layers, and ``_gdn_capture``, sum their parts); pipeline
    parallel runs this rank's layers (``pipeline_layers``, which ``cache`` and the capture
    indices follow) between receiving the hidden from the rank before and sending it on,
    then every rank gets the last rank's hidden, as mlx-lm's own forward does.
    """
    cpu = device.is_cpu()
    inner = text_model.model
    if cpu and "_mtpchat_group" not in inner.__dict__:
        inner.__dict__["_mtpchat_group"] = share_compiled(inner.layers)
    x = inner.embed_tokens(inputs)
    fa_mask = None if inner.fa_idx is None else create_attention_mask(x, cache[inner.fa_idx])
    ssm_mask = None if inner.ssm_idx is None else create_ssm_mask(x, cache[inner.ssm_idx])
    rank, size = getattr(inner, "pipeline_rank", 0), getattr(inner, "pipeline_size", 1)
    if rank < size - 1:  # mlx-lm's order: the last rank runs the first layers
        x = mx.distributed.recv_like(x, rank + 1)
    fused = capture or inputs.shape[1] == 1
    chunked = cpu and not capture and inputs.shape[1] >= CHUNKED_PREFILL_MIN
    _check_mark(mark, chunked, inputs.shape[1])
    captures: dict[int, GDNCapture] = {}
    for i, (layer, c) in enumerate(zip(inner.pipeline_layers, cache)):
        if not fused or (layer.is_linear and ssm_mask is not None and not capture):
            if not layer.is_linear:
                x = _prefill_attention(layer, x, fa_mask, c, cpu)
                continue
            if chunked:
                x, cap = linear_prefill(layer, x, c, cpu, project, mark, ssm_mask)
                if cap is not None:
                    captures[i] = cap
                continue
            x = layer(x, mask=ssm_mask, cache=c)
            continue
        if layer.is_linear:
            x, cap = linear_layer(layer, x, c, cpu, project)
            if capture:
                captures[i] = cap
        else:
            x = attention_layer(layer, x, fa_mask, c, cpu)
    if size > 1:
        if rank != 0:
            x = mx.distributed.send(x, rank - 1)
        x = mx.distributed.all_gather(x)[:x.shape[0]]
    return inner.norm(x), captures


def commit_captures(cache: list, captures: dict[int, GDNCapture], step: int) -> None:
    """Keep the GDN state after verify step ``step`` (0-based) in every linear layer."""
    for i, cap in captures.items():
        cache[i][0] = cap.conv[step]
        cache[i][1] = cap.state[step]


def trim_attention(cache: list, n: int) -> None:
    if n <= 0:
        return
    for c in cache:
        if hasattr(c, "trim") and c.is_trimmable():
            c.trim(n)
