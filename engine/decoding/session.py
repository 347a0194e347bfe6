"""The decode state of one conversation: the trunk and MTP caches and their invariants.

``Session`` is a conversation's caches outside a batch: a prompt is prefilled into one (in
chunks, resumed from a snapshot), it joins a batch as a row (``engine.decoding.batch_caches.Batch.join``) and
comes back out as one when its reply ends (``Batch.extract``). ``PromptCache`` keeps
snapshots of sessions between replies.

Invariants (MTP_SPEC §3): ``fed`` is every token the trunk has consumed; ``last_hidden`` is the
trunk hidden (after the final norm) of the last fed token; the MTP cache holds one row per
committed pair (h_t, x_{t+1}) built from trunk hiddens, except the pairs still ``pending``
(appended at the next MTP forward, which is also the next draft's first step).
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

import mlx.core as mx

from engine.decoding import side


PREFILL_CHUNK = 512
_lineages = itertools.count(1)


@dataclass
class Snapshot:
    fed: tuple[int, ...]
    trunk_state: list
    mtp_state: list | None
    mtp_rows: int
    pending_h: mx.array | None
    pending_tok: tuple[int, ...]
    last_hidden: mx.array | None
    last_logits: mx.array
    mtp_ok: bool
    lineage: int = 0  # snapshots of one lineage share buffers (see ``PromptCache``)
    rope_delta: int = 0   # M-RoPE: position - index past the prompt's images (engine.vision)
    media: tuple = ()     # the images fed: (start, tokens, digest) each (engine.vision)


def _cache_state(cache: list) -> list:
    out = []
    for c in cache:
        if _is_kv(c):
            out.append(("kv", c.keys, c.values, c.offset))
        else:
            out.append(("arr", list(c.cache)))
    return out


def _restore_state(cache: list, state: list) -> None:
    for c, s in zip(cache, state):
        if s[0] == "kv":
            c.keys, c.values, c.offset = s[1], s[2], s[3]
        else:
            c.cache = list(s[1])


@dataclass
class Session:
    model: object                       # engine.models.model.Model
    use_mtp: bool
    trunk_cache: list = field(default_factory=list)
    mtp_cache: list | None = None
    fed: list[int] = field(default_factory=list)
    mtp_rows: int = 0
    pending_h: mx.array | None = None   # [1, n, H] trunk hiddens of pending pairs
    pending_tok: list[int] = field(default_factory=list)
    last_hidden: mx.array | None = None
    last_logits: mx.array | None = None  # [1, V]
    mtp_ok: bool = True
    # which buffers this session writes into: a fresh session starts a lineage, a resumed
    # one continues its snapshot's (``PromptCache``)
    lineage: int = field(default_factory=lambda: next(_lineages))
    rope_delta: int = 0   # see ``Snapshot``; every attention cache carries it too
    media: tuple = ()
    marked: Snapshot | None = None  # ``prefill_chunks``'s state at its ``mark``

    @classmethod
    def fresh(cls, model, *, use_mtp: bool) -> "Session":
        s = cls(model=model, use_mtp=use_mtp)
        s.trunk_cache = model.make_cache()
        s.mtp_cache = model.mtp.make_cache() if (use_mtp and model.mtp is not None) else None
        s.mtp_ok = s.mtp_cache is not None
        return s

    # -- prompt cache -----------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return Snapshot(
            fed=tuple(self.fed), trunk_state=_cache_state(self.trunk_cache),
            mtp_state=_cache_state(self.mtp_cache) if self.mtp_cache else None,
            mtp_rows=self.mtp_rows, pending_h=self.pending_h, pending_tok=tuple(self.pending_tok),
            last_hidden=self.last_hidden, last_logits=self.last_logits, mtp_ok=self.mtp_ok,
            lineage=self.lineage, rope_delta=self.rope_delta, media=tuple(self.media))

    @classmethod
    def from_snapshot(cls, model, snap: Snapshot, *, use_mtp: bool) -> "Session":
        s = cls.fresh(model, use_mtp=use_mtp)
        _restore_state(s.trunk_cache, snap.trunk_state)
        if s.mtp_cache is not None and snap.mtp_state is not None:
            _restore_state(s.mtp_cache, snap.mtp_state)
        s.fed, s.mtp_rows = list(snap.fed), snap.mtp_rows
        s.pending_h, s.pending_tok = snap.pending_h, list(snap.pending_tok)
        s.last_hidden, s.last_logits = snap.last_hidden, snap.last_logits
        s.mtp_ok = snap.mtp_ok and s.mtp_cache is not None
        s.lineage = snap.lineage or s.lineage  # 0: read back from disk, shares no buffer
        s.media = tuple(snap.media)
        s.set_rope_delta(snap.rope_delta)
        return s

    def set_rope_delta(self, delta: int) -> None:
        """Where text continues past the images fed (M-RoPE: ``engine.vision.positions``):
        kept on every attention cache, whose offset the attention layers shift by it.
        Never set for a text-only conversation (delta 0: the caches stay as they were)."""
        self.rope_delta = delta
        if not delta:
            return
        for c in list(self.trunk_cache) + list(self.mtp_cache or []):
            if hasattr(c, "offset") and hasattr(c, "keys"):
                c.rope_delta = delta

    # -- feeding tokens -----------------------------------------------------------------
    def _queue_pairs(self, tokens: list[int], hidden: mx.array) -> None:
        """After feeding ``tokens`` with trunk hiddens ``hidden`` [1, n, H], queue the new
        committed pairs (h_{t}, x_{t+1}) for the MTP cache."""
        if not self.use_mtp:
            return
        hs, toks = [], []
        if self.last_hidden is not None:
            hs.append(self.last_hidden)
            toks.append(tokens[0])
        if len(tokens) > 1:
            hs.append(hidden[:, :-1])
            toks.extend(tokens[1:])
        if not hs:
            return
        if self.pending_h is not None:
            hs.insert(0, self.pending_h)
        self.pending_h = mx.concatenate(hs, axis=1) if len(hs) > 1 else hs[0]
        self.pending_tok.extend(toks)

    def flush_pending(self) -> None:
        """Append the pending pairs to the MTP cache (K/V only matter; output discarded)."""
        if self.pending_h is None or not self.pending_tok:
            return
        with side.side():  # only a draft reads them: computed on the other core meanwhile
            emb = self.model.embed(mx.array(self.pending_tok)[None])
            self.model.mtp(self.pending_h, emb, self.mtp_cache)
        side.start([a for c in self.mtp_cache for a in (c.keys, c.values)])
        self.mtp_rows += len(self.pending_tok)
        self.pending_h, self.pending_tok = None, []

    def prefill(self, tokens: list[int], images=()) -> None:
        """Feed ``tokens`` in chunks (bounded memory); leaves last_logits lazy-evaluated."""
        for _ in self.prefill_chunks(tokens, images):
            pass

    def settle(self) -> None:
        """Evaluate what has been fed (the trunk's caches and the last hidden, whose graph
        holds every collective of a cluster's forwards)."""
        mx.eval([c.state for c in self.trunk_cache] + [self.last_hidden])

    def prefill_chunks(self, tokens: list[int], images=(), mark: int | None = None,
                       ) -> Iterator[int]:
        """``prefill`` one chunk at a time: yields the tokens fed so far after each chunk
        (every chunk but the last is evaluated before the yield), so a caller can run other
        work between chunks (``engine.decoding.admission``: a joining stream never stalls the batch
        for more than one chunk). ``images``: the prompt's placed images
        (``engine.vision.prompt.PlacedImage``); a span holding one is fed by
        ``engine.vision.prefill`` (embeddings spliced in, M-RoPE positions).

        ``mark`` (0 < mark < len(tokens), no images): ``marked`` becomes the state after the
        first ``mark`` tokens (a ``Snapshot``), by the end of the chunk that holds them: taken
        inside that chunk's forward where the model can (``Model.marks``), else by splitting
        the chunk there into two forwards, without a yield between them."""
        self.marked = None
        if mark is not None and (images or not 0 < mark < len(tokens)):
            raise ValueError(f"no mark at {mark} of {len(tokens)} tokens"
                             + (" with images" if images else ""))
        if images:
            from engine.vision import prefill as vision_prefill

            inside = vision_prefill.span_images(self, tokens, images)
            if inside:
                yield from vision_prefill.prefill_chunks(self, tokens, inside, PREFILL_CHUNK)
                return
        i = 0
        while i < len(tokens):
            j = min(i + PREFILL_CHUNK, len(tokens))
            inner = mark if mark is not None and i < mark < j else None
            if inner is not None and not self.model.marks(j - i):
                j, inner = mark, None  # split: this part, then the rest in the same step
            self._feed(tokens[i:j], None if inner is None else inner - i, last=j == len(tokens))
            if j == mark:
                self.marked = self.snapshot()
            elif j < len(tokens):
                self.settle()
            if j != mark:
                yield j
            i = j

    def _feed(self, chunk: list[int], mark: int | None, *, last: bool) -> None:
        """One forward over ``chunk`` (``mark``: ``marked`` is the state after that many of
        its tokens); ``last``: the prompt's last chunk (its logits are drawn from)."""
        model = self.model
        h, caps = model.forward_hidden(mx.array(chunk)[None], self.trunk_cache, mark=mark)
        self._queue_pairs(chunk, h)
        self.last_hidden = h[:, -1:]
        self.fed.extend(chunk)
        if self.use_mtp:
            self.flush_pending()
        if mark is not None:
            self.marked = self._snapshot_back(len(chunk) - mark, h, caps)
        # logits only after the prompt's last chunk (None between: a snapshot taken there must
        # not carry an earlier position's)
        self.last_logits = model.lm_head(self.last_hidden[:, -1]) if last else None

    def _snapshot_back(self, back: int, h: mx.array, caps: dict) -> Snapshot:
        """The state ``back`` tokens before the end of what was fed, by the last forward
        (its hiddens ``h``; ``caps``: each GDN layer's state there): every attention cache's
        prefix (the same buffers: this lineage's), the MTP cache without the last ``back``
        pairs (those whose target token lies past the mark; none is pending after a chunk)."""
        trunk = [("kv", c.keys, c.values, c.offset - back) if _is_kv(c) else
                 ("arr", [caps[i].conv[0], caps[i].state[0]])
                 for i, c in enumerate(self.trunk_cache)]
        mtp = None if not self.mtp_cache else \
            [("kv", c.keys, c.values, c.offset - back) for c in self.mtp_cache]
        S = h.shape[1]
        return Snapshot(
            fed=tuple(self.fed[:len(self.fed) - back]), trunk_state=trunk, mtp_state=mtp,
            mtp_rows=self.mtp_rows - back if mtp else self.mtp_rows, pending_h=None,
            pending_tok=(), last_hidden=h[:, S - back - 1:S - back], last_logits=None,
            mtp_ok=self.mtp_ok, lineage=self.lineage, rope_delta=self.rope_delta,
            media=tuple(self.media))


def _is_kv(cache) -> bool:
    return hasattr(cache, "offset") and hasattr(cache, "keys")


@dataclass
class PromptCache:
    """Snapshots of conversations' decode state (after the prompt, after the reply).

    Snapshots of one *lineage* (a session and the ones resumed from its snapshots) share
    attention buffers: resuming one writes into them, so ``take`` drops that lineage's other
    snapshots. Other lineages (other conversations) are independent; up to ``max_lineages``
    of them are kept, the least recently kept dropped first. With the default 1, starting a
    reply frees every other conversation's state before its prefill (one conversation's
    memory, as a single chat needs); a batch of streams (``engine.decoding.decoder``) raises it so
    concurrent conversations (an agent's sub-agents) each find their own next turn cached.
    """

    snapshots: list[Snapshot] = field(default_factory=list)
    max_lineages: int = 1

    def keep(self, snap: Snapshot) -> None:
        self.snapshots.append(snap)
        order: list[int] = []
        for s in reversed(self.snapshots):  # most recently kept first
            if s.lineage not in order:
                order.append(s.lineage)
        keep = set(order[:max(1, self.max_lineages)])
        self.snapshots = [s for s in self.snapshots if s.lineage in keep]

    def take(self, prompt: list[int], *, need_mtp: bool = False,
             media: tuple = ()) -> Snapshot | None:
        """The longest snapshot whose tokens start ``prompt`` (with ``need_mtp``: only one
        whose MTP cache is in step) and whose images are the prompt's images in that prefix
        (``media``: (start, tokens, digest) of each: equal ids with other pixels never
        match)."""
        best = self._longest(prompt, need_mtp, media)
        if self.max_lineages <= 1:
            self.snapshots = []
        elif best is not None:  # its lineage's buffers are about to be written
            self.snapshots = [s for s in self.snapshots if s.lineage != best.lineage]
        return best

    def holds(self, prompt: list[int], *, need_mtp: bool = False, media: tuple = ()) -> bool:
        """Whether ``take`` would find a snapshot for ``prompt`` (nothing dropped)."""
        return self._longest(prompt, need_mtp, media) is not None

    def _longest(self, prompt: list[int], need_mtp: bool, media: tuple) -> Snapshot | None:
        best = None
        for s in self.snapshots:
            n = len(s.fed)
            if need_mtp and not s.mtp_ok:
                continue
            if (s.media or media) and not media_match(s.media, media, n):
                continue
            if n <= len(prompt) and tuple(prompt[:n]) == s.fed and n > 0:
                if n == len(prompt) and s.last_logits is None:
                    continue
                if best is None or n > len(best.fed):
                    best = s
        return best


def media_match(have: tuple, media: tuple, n: int) -> bool:
    """Whether a state of ``n`` fed tokens holding images ``have`` is a prefix of a prompt
    with images ``media``: the same images up to ``n``, none of them cut at ``n``."""
    if any(start < n < start + tokens for start, tokens, _ in media):
        return False
    return tuple(have) == tuple(m for m in media if m[0] < n)
