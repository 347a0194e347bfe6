"""The memory budget: every request's memory need is estimated before it starts, so the process
stays under a budget instead of swapping the machine to death.

Contract:
- ``Footprint.of(model)``: per-model constants from its config — attention KV bytes per token
  (the trunk's full-attention layers and the MTP head's layers), the Gated DeltaNet state per
  row (conv window + recurrent state, kept once per verify step), the per-row activations of a
  cycle (logits over ``depth + 1`` tokens), a prefill chunk's transient (its logits, hidden
  states and attention scores over the context). None for a model without a config (a
  scripted fake): no gate then.
- ``need(prompt, reply_tokens, depth)``: bytes one request adds while it runs.
- ``MemoryGate(budget)``: ``budget`` bytes for the whole process (None: ``default_budget()``:
  on a Mac MLX's recommended working set, else ``SAFE_SHARE`` of the RAM, never more than
  what is in use now plus ``AVAILABLE_SHARE`` of what is available). ``attach(model)``
  measures the base (the process's resident memory with the model loaded) and sets MLX's
  memory limit to the budget and its cache limit to a share of the headroom (on the CPU
  branch at most ``allocator.CPU_CACHE_LIMIT``: ``engine.core.allocator``).
  ``verdict(rid, prompt, max_tokens, depth)`` -> ``("run", max_tokens)`` (reserved; a
  ``max_tokens`` that would outgrow the budget alone is cut to what fits, and the reply then
  ends with ``finish_reason="length"`` and a note), ``("wait", None)`` (it fits alone but not
  beside what runs: it stays queued) or raises ``MemoryRefused`` (a 400 naming the limit:
  even its prompt does not fit). A request reserves its prompt plus at most
  ``RESERVE_REPLY_TOKENS`` of its reply; ``over(rows)`` says which running rows would grow
  past the budget in the next cycle (the scheduler ends them with ``"length"``).
  ``release(rid)`` frees a reservation (its final state may stay in the prompt cache: counted
  as ``kept`` until ``drop_kept()``, which the scheduler calls when a request must wait).
- ``status()``: budget, base, reserved and the process's resident memory now, for
  ``/health`` and the dashboard.

No Qt; MLX and psutil are imported lazily.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from engine.core import allocator
from engine.errors import GenerationError

log = logging.getLogger(__name__)

SAFE_SHARE = 0.7           # of the machine's RAM, the default budget
AVAILABLE_SHARE = 0.8      # ... and at most what is in use now plus this share of the free
RESERVE_REPLY_TOKENS = 4096  # reply tokens reserved up front (the rest: checked each cycle)
PREFILL_CHUNK = 512        # engine.decoding.session's chunk (the transient's size)
OTHER_BYTES_PER_TOKEN = 1024  # ids, detokenizer, bookkeeping
ACTIVATION_COPIES = 6      # logits, probabilities, candidates... per verified token
CACHE_SHARE = 0.1          # of the headroom, MLX's buffer cache limit (counted as used)


class MemoryRefused(GenerationError):
    """A request whose memory need alone exceeds the budget (HTTP 400)."""


def size_text(n: float) -> str:
    """A byte count in decimal units, as everywhere in the app: "1.23 GB", "456 MB"."""
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def cut_note(tokens: int, budget: int) -> str:
    """What a reply cut short by the budget says."""
    return (f"The reply was cut at {tokens:,} tokens: a longer one would outgrow the memory "
            f"budget ({size_text(budget)}, --memory-budget).")


@dataclass(frozen=True)
class Footprint:
    """See the module docstring."""

    per_token: int        # attention KV (trunk + MTP head) and bookkeeping, per token
    gdn_state: int        # one row's Gated DeltaNet state (every linear layer)
    per_verify_token: int  # activations per verified token of one row
    chunk_fixed: int      # a prefill chunk's logits and hidden states
    score_per_ctx: int    # a prefill chunk's attention scores per context token

    @classmethod
    def of(cls, model) -> Footprint | None:
        trunk = getattr(model, "trunk", None)
        info = getattr(model, "info", None)
        args = getattr(trunk, "args", None)
        if trunk is None or info is None or args is None:
            return None
        from engine.models.prompt_limits import kv_bytes_per_token

        cfg = getattr(args, "text_config", None)
        cfg = cfg if isinstance(cfg, dict) else vars(args)

        def num(key: str, default: int = 0) -> int:
            v = cfg.get(key, default)
            return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default

        kv = kv_bytes_per_token(trunk)
        layers = num("num_hidden_layers", info.num_layers)
        full = max(layers // (num("full_attention_interval", 1) or 1), 1)
        mtp_kv = kv // full * int(getattr(info, "mtp_layers", 0) or 0)
        hk, dk = num("linear_num_key_heads"), num("linear_key_head_dim")
        hv, dv = num("linear_num_value_heads"), num("linear_value_head_dim")
        conv = (2 * hk * dk + hv * dv) * max(num("linear_conv_kernel_dim", 4) - 1, 0)
        gdn = (layers - full) * (hv * dv * dk * 4 + conv * 4)
        vocab, hidden = info.vocab_size, info.hidden_size
        heads = num("num_attention_heads", 1)
        return cls(per_token=kv + mtp_kv + OTHER_BYTES_PER_TOKEN, gdn_state=gdn,
                   per_verify_token=ACTIVATION_COPIES * 4 * (vocab + 8 * hidden),
                   chunk_fixed=PREFILL_CHUNK * 4 * (2 * vocab + 24 * hidden),
                   score_per_ctx=PREFILL_CHUNK * heads * 4 * 2)

    def need(self, prompt: int, reply_tokens: int, depth: int) -> int:
        """Bytes one request adds while it runs (see the module docstring)."""
        tokens = prompt + reply_tokens + depth + 1
        prefill = self.chunk_fixed + self.score_per_ctx * (prompt + 1)
        row = self.gdn_state * (depth + 3) + self.per_verify_token * (depth + 1)
        return tokens * self.per_token + max(prefill, row)


def parse_budget(text: str) -> int:
    """``--memory-budget``: bytes from "8GB", "512MB", "6.5G", "0.5" (GB) or plain bytes; a
    leading "+" ("+2GB") means that much beside the loaded model (returned negative)."""
    t = str(text).strip().upper().replace(" ", "").removesuffix("B").removesuffix("I")
    if t.startswith("+"):
        return -parse_budget(t[1:])
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    try:
        if t and t[-1] in units:
            value = float(t[:-1]) * units[t[-1]]
        else:
            value = float(t)
            value = value * 2**30 if value < 4096 else value  # a small number means GB
    except ValueError:
        raise ValueError(f"--memory-budget takes a size such as 8GB or 512MB, not {text!r}") \
            from None
    if not value > 0:
        raise ValueError(f"--memory-budget must be more than 0, not {text!r}")
    return int(value)


def default_budget() -> int:
    """MLX's recommended working set on a Mac's GPU, else ``SAFE_SHARE`` of the RAM."""
    try:
        import mlx.core as mx

        if mx.metal.is_available():
            size = int(mx.metal.device_info().get("max_recommended_working_set_size") or 0)
            if size > 0:
                return size
    except Exception:  # noqa: BLE001 - no Metal: the RAM decides
        pass
    import psutil

    return int(psutil.virtual_memory().total * SAFE_SHARE)


def resident_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class MemoryGate:
    """See the module docstring. Called on the model's thread; ``status`` from any."""

    def __init__(self, budget: int | None = None) -> None:
        self.asked = budget
        self.budget = 0
        self.base = 0
        self.kept = 0
        self.footprint: Footprint | None = None
        self.cache_limit = 0
        self.auto_depth = 0  # the deepest draft an auto row may make (the model's)
        self._reserved: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def reserved(self) -> int:
        with self._lock:
            return sum(self._reserved.values())

    def attach(self, model) -> None:
        """Measure the base with ``model`` loaded and set MLX's limits (None: no model)."""
        self.footprint = Footprint.of(model) if model is not None else None
        self.auto_depth = int(getattr(getattr(model, "info", None), "max_depth", 0) or 0)
        with self._lock:
            self._reserved.clear()
        self.kept = 0
        if self.footprint is None:
            return
        import psutil

        self.base = resident_bytes()
        budget = self.asked
        if budget is not None and budget < 0:  # "+SIZE": beside the model
            budget = self.base - budget
        if budget is None:
            budget = min(default_budget(),
                         self.base + int(psutil.virtual_memory().available * AVAILABLE_SHARE))
        self.budget = int(budget)
        self.cache_limit = max(int((self.budget - self.base) * CACHE_SHARE), 0)
        if allocator.enabled():  # glibc keeps freed memory; MLX's cache (counted as used) small
            allocator.reuse_freed_memory()
            self.cache_limit = min(self.cache_limit, allocator.CPU_CACHE_LIMIT)
        self._set_mlx_limits()
        log.info("memory budget %s (base %s with the model loaded)", size_text(self.budget),
                 size_text(self.base))

    def _set_mlx_limits(self) -> None:
        try:
            import mlx.core as mx

            mx.set_memory_limit(max(self.budget, 1))
            mx.set_cache_limit(self.cache_limit)
        except Exception:  # noqa: BLE001 - an MLX without these calls: the gate still holds
            log.debug("could not set MLX's memory limits", exc_info=True)

    def verdict(self, rid: str, prompt: int, max_tokens: int, depth: int | str,
                ) -> tuple[str, int | None]:
        """See the module docstring (``depth`` "auto": the model's deepest draft)."""
        depth = self.auto_depth if depth == "auto" else int(depth)
        fp = self.footprint
        if fp is None:
            return "run", max_tokens
        room = self.budget - self.base - self.cache_limit
        if fp.need(prompt, 1, depth) > room:
            raise MemoryRefused(
                f"This request needs about {size_text(fp.need(prompt, 1, depth))} of memory for its "
                f"{prompt:,}-token prompt, more than the {size_text(max(room, 0))} the memory "
                f"budget ({size_text(self.budget)}, --memory-budget) leaves beside the model. "
                "Shorten the prompt or raise the budget.")
        fits = max_tokens
        if fp.need(prompt, max_tokens, depth) > room:  # the most reply tokens that fit alone
            fits = max(1, (room - fp.need(prompt, 0, depth)) // fp.per_token)
        need = fp.need(prompt, min(fits, RESERVE_REPLY_TOKENS), depth)
        if self.base + self.cache_limit + self.kept + self.reserved + need > self.budget:
            return "wait", None
        with self._lock:
            self._reserved[rid] = need
        return "run", min(fits, max_tokens)

    def refusal(self) -> MemoryRefused:
        """For a request that must wait for memory though nothing else runs."""
        return MemoryRefused("This request does not fit in the memory budget "
                             f"({size_text(self.budget)}, --memory-budget).")

    def remeasure(self) -> None:
        """While nothing runs: what the process holds beyond the kept replies and MLX's
        buffer cache (compiled graphs, the server's own objects, allocator slack) joins the
        base, so the estimate follows the process as it grows (never shrinks: conservative)."""
        if self.footprint is None:
            return
        try:
            import mlx.core as mx

            from engine.models.prompt_limits import release_memory

            release_memory()
            now = resident_bytes() - self.kept - int(mx.get_cache_memory())
        except Exception:  # noqa: BLE001 - keep the last base
            return
        self.base = max(self.base, now)

    def release(self, rid: str, tokens: int = 0) -> None:
        with self._lock:
            had = self._reserved.pop(rid, None)
        if had is not None and self.footprint is not None:
            self.kept += tokens * self.footprint.per_token

    def drop_kept(self) -> None:
        self.kept = 0

    def free_kept(self, carryover) -> None:
        """Free what finished replies keep (``carryover``'s prompt cache) so a waiting
        request fits."""
        if self.kept:
            carryover.reset_prompt_cache()
            self.kept = 0
            import mlx.core as mx

            mx.clear_cache()

    def cut_growth(self, streams, live, cut_already) -> list[str]:
        """The decoder's running ``streams`` (those in ``live``) whose next cycle would take
        the estimate past the budget: each gets a budget of one more token, so it ends with
        ``"length"``; returns their ids (those in ``cut_already`` are not cut again)."""
        if self.footprint is None:  # no estimate (a scripted fake)
            return []
        rows = [(st.id, len(st.prompt), len(st.reply.generated),
                 st.depth if isinstance(st.depth, int) else self.auto_depth)
                for st in streams if st.id in live]
        over = set(self.over(rows))
        cut = []
        for st in streams:
            if st.id in over and st.id not in cut_already:
                st.reply.budget = min(st.reply.budget, len(st.reply.generated) + 1)
                cut.append(st.id)
        return cut

    def over(self, rows: list[tuple[str, int, int, int]]) -> list[str]:
        """``rows``: (id, prompt tokens, generated tokens, depth) of each running row. The ids
        whose growth in the next cycle would take the estimate past the budget (newest
        first, until the rest fit)."""
        fp = self.footprint
        if fp is None or not rows:
            return []
        grown = {rid: fp.need(p, g + d + 1, d) for rid, p, g, d in rows}
        with self._lock:
            held = {rid: max(grown[rid], self._reserved.get(rid, 0)) for rid in grown}
        total = self.base + self.cache_limit + self.kept + sum(held.values())
        cut = []
        for rid, *_ in reversed(rows):
            if total <= self.budget:
                break
            cut.append(rid)
            total -= held[rid]
        return cut

    def status(self) -> dict:
        if self.footprint is None:
            return {}
        try:
            rss = resident_bytes()
        except Exception:  # noqa: BLE001
            rss = 0
        return {"budget_bytes": self.budget, "base_bytes": self.base,
                "reserved_bytes": self.reserved + self.kept, "resident_bytes": rss}
