"""What carries from one reply to the next: ``Carryover`` (prompt cache, disk cache, depth
controllers), owned by the engine core, never by the ``Model`` (weights, tokenizer, facts).

A decoder reads and writes the carryover it is given: it resumes a prompt from the longest
saved snapshot (in memory, then on disk), keeps the snapshots after the prompt and after the
reply (and before the chat template's generation prompt, where the next turn's prompt stops
matching: ``Carryover.checkpoint``), and asks for the depth controller of its batch size. ``carryover_of(model)`` is the
one a model's replies share by default (``Model.generate``, the scheduler, the CLI), made on
first use and dropped with the model.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field

from engine.decoding import diskcache, draft_vocab
from engine.decoding.session import PromptCache, Session, Snapshot
from engine.depth.controller import AdaptiveDepth, carry_over
from engine.hub import store

log = logging.getLogger(__name__)

AUTO_MAX_DEPTH = 4  # the deepest draft ``depth="auto"`` considers
CONTINUE_TAIL = 32  # a prompt's last tokens a conversation's next prompt need not repeat
SAVE_COUNTS_EVERY = 4096  # reply tokens between two saves of the draft vocabulary's counts


@dataclass
class Carryover:
    """See the module docstring. ``controllers`` maps a batch size to its auto rows' depth
    controller; 1 is a lone stream's (shared by ``Model.generate`` and the scheduler)."""

    prompt_cache: PromptCache = field(default_factory=PromptCache)
    disk_cache: object | None = None   # engine.decoding.diskcache.DiskPromptCache | None
    controllers: dict[int, AdaptiveDepth] = field(default_factory=dict)
    suffixes: tuple[tuple[int, ...], ...] | None = None  # the generation prompts' tokens
    # batch size -> {depth: cycle seconds}, measured by the warm-up (``engine.core.warmup``)
    cost_hints: dict[int, dict[int, float]] = field(default_factory=dict)
    # conditional acceptance by draft position, seen by the warm-up's greedy cycles
    acceptance_hint: list[float] = field(default_factory=list)
    # how often each token ended up in the model's replies, where it drafts on a set of its
    # vocabulary (``engine.decoding.draft_vocab``): the set's ranking; saved with the weights
    token_counts: draft_vocab.TokenCounts | None = None
    model_dir: str | None = None
    learns: bool = True  # its replies join ``token_counts`` (the warm-up's rank by them only)
    # the prompt of the last lone ``auto`` request (``continues``)
    last_prompt: tuple[int, ...] = ()

    @classmethod
    def for_model(cls, model) -> "Carryover":
        """A fresh carryover, with the disk cache the environment turns on for ``model``."""
        info = model.info
        disk = diskcache.from_env(
            info.path, info.dtype, model.make_cache(),
            model.mtp.make_cache() if model.mtp is not None else None)
        carry = cls(disk_cache=disk, model_dir=info.path)
        carry.hint(*_saved_hint(info))
        if draft_vocab.wants_set(model):
            carry.token_counts = _saved_counts(info)
        return carry

    def observe(self, tokens: list[int]) -> None:
        """A finished reply's tokens join the counts (where the model drafts on a set); saved
        every ``SAVE_COUNTS_EVERY`` tokens."""
        counts = self.token_counts
        if counts is None or not tokens or not self.learns:
            return
        counts.add(tokens)
        if counts.unsaved >= SAVE_COUNTS_EVERY and self.model_dir:
            try:
                store.write_token_counts(self.model_dir, counts.to_json())
                counts.unsaved = 0
            except Exception:  # noqa: BLE001 - the counts never cost a reply
                log.warning("could not save the draft vocabulary's counts", exc_info=True)

    def reset_prompt_cache(self) -> None:
        self.prompt_cache = PromptCache()

    # -- the prompt cache ---------------------------------------------------------------
    def session_for(self, model, prompt: list[int], use_mtp: bool,
                    media: tuple = ()) -> tuple[Session, int]:
        """A session resumed from the longest usable snapshot: in memory first, then on disk
        (only for prompts it would have saved); else a fresh one. Returns it and how many
        prompt tokens it already holds. ``media``: the prompt's images, (start, tokens,
        digest) each: a snapshot matches only with the same images (not only the same ids)."""
        snap = self.prompt_cache.take(prompt, need_mtp=use_mtp, media=media)
        disk = self.disk_cache
        if disk is not None and len(prompt) >= disk.min_tokens:
            snap = disk.load(prompt, longer_than=len(snap.fed) if snap else 0,
                             need_mtp=use_mtp, media=media) or snap
        if snap is not None:
            return Session.from_snapshot(model, snap, use_mtp=use_mtp), len(snap.fed)
        return Session.fresh(model, use_mtp=use_mtp), 0

    def checkpoint(self, model, prompt: list[int]) -> int | None:
        """Where the next turn's prompt will stop matching this one: before the chat
        template's generation prompt, when ``prompt`` ends with one (None otherwise).

        A template may render the turn being generated unlike the same turn once answered
        (Qwen3.5 with thinking off opens an empty ``<think></think>`` block that earlier
        turns do not show), so the state after the whole prompt is never a prefix of the
        next turn's; the state at this point is (the decoder keeps it, issue 35)."""
        if self.suffixes is None:
            self.suffixes = _generation_suffixes(model)
        for suffix in self.suffixes:
            n = len(prompt) - len(suffix)
            if n > 0 and tuple(prompt[n:]) == suffix:
                return n
        return None

    def keep(self, after_prompt: Snapshot, at_end: Snapshot,
             checkpoint: Snapshot | None = None) -> None:
        """Keep a reply's final state in memory; the snapshots go to the disk cache (if on),
        written in the background while nothing decodes (``checkpoint``: the state before the
        generation prompt)."""
        self.prompt_cache.keep(at_end)
        if self.disk_cache is not None:
            try:
                self.disk_cache.save([s for s in (checkpoint, after_prompt, at_end)
                                      if s is not None])
            except Exception:  # noqa: BLE001 - the disk cache never costs a reply
                log.warning("could not save the prompt cache", exc_info=True)

    # -- depth controllers --------------------------------------------------------------
    def continues(self, prompt) -> bool:
        """Whether ``prompt`` continues the conversation of the last lone ``auto`` request
        (its prompt, up to its last ``CONTINUE_TAIL`` tokens where a template renders the turn
        being answered unlike an answered one, starts this one, or is this one: a regenerated
        reply); remembers ``prompt``. The lone stream's depth controller then keeps that
        reply's acceptance behind the new one's (``AdaptiveDepth.new_request``): an agent's
        turns, a chat's questions."""
        last, self.last_prompt = self.last_prompt, tuple(prompt)
        n = len(last) - CONTINUE_TAIL
        return n > 0 and len(prompt) >= len(last) and tuple(prompt[:n]) == last[:n]

    def controller(self, model, rows: int, *, drafter: bool = False) -> AdaptiveDepth:
        """The depth controller of the auto rows while ``rows`` streams decode together.

        A padded verify costs the same for every row, so the depth that maximises the
        aggregate speed is one decision for the batch: auto rows share a controller per batch
        size (acceptance pooled over them, cycle time of the whole batch). A lone stream's
        (``rows == 1``) starts from the machine's saved tuning and carries what it learnt
        from one reply to the next; a new one for another size starts from what the
        controller of the nearest size learnt (acceptance, cycle costs, depth), so it needs no
        warm-up. ``drafter``: a passed-in drafter (not the MTP head) gets a fresh one."""
        max_d = AUTO_MAX_DEPTH if drafter else min(model.info.max_depth or 3, AUTO_MAX_DEPTH)
        if drafter:
            return AdaptiveDepth(max_d, initial=_tuned(model))
        c = self.controllers.get(rows)
        if c is not None and c.max_depth == max_d:
            return c
        if rows == 1:
            c = carry_over(c, max_d, initial=self._hinted(_tuned(model), rows, keep=True))
        else:
            known = {n: k for n, k in self.controllers.items() if k.max_depth == max_d}
            near = min(known, key=lambda n: (abs(n - rows), n), default=None)
            c = AdaptiveDepth(max_d, initial=self._hinted(
                None if near is None else known[near].state(), rows, keep=False))
        self.controllers[rows] = c
        return c

    def hint(self, costs: dict[int, dict[int, float]],
             acceptance: list[float] | None = None) -> None:
        """Cycle seconds by depth for batch sizes and conditional acceptance by draft
        position (the warm-up's greedy cycles): a controller made later starts from them
        instead of timing every depth itself and from a generic acceptance prior (one
        already learning keeps its own). Costs are made non-decreasing in the batch size
        (``monotone_rows``) and in depth (``monotone_costs``)."""
        for rows, by_depth in monotone_rows(costs).items():
            self.cost_hints[rows] = monotone_costs(by_depth)
        if acceptance:
            self.acceptance_hint = [float(a) for a in acceptance]

    def _hinted(self, initial: dict | None, rows: int, *, keep: bool) -> dict | None:
        """``initial`` with this batch size's hinted costs (``keep``: only where ``initial``
        gives fewer than two costs of its own, e.g. no saved tuning) and the hinted
        acceptance where ``initial`` gives none."""
        out = dict(initial or {})
        hint = self.cost_hints.get(rows)
        if hint and len(hint) >= 2 and not (keep and len(out.get("cost") or {}) >= 2):
            out["cost"] = {str(d): t for d, t in hint.items()}
        if self.acceptance_hint and not out.get("acceptance"):
            out["acceptance"] = list(self.acceptance_hint)
        return out if out else initial


def monotone_costs(by_depth: dict[int, float]) -> dict[int, float]:
    """Cycle seconds by depth with each depth's at most any deeper one's (a deeper cycle does
    all a shallower one does and more: a cost above a deeper one's was measured while
    something else ran, or still compiling). Seen: a warm-up that ran beside another process's
    kept 36 ms for depth 2 and 13 ms for depth 4 on one row, and every later process's
    controllers started out avoiding depths 2 and 3."""
    out, low = {}, float("inf")
    for d in sorted(by_depth, reverse=True):
        low = min(low, by_depth[d])
        out[d] = low
    return dict(sorted(out.items()))


def monotone_rows(costs: dict[int, dict[int, float]]) -> dict[int, dict[int, float]]:
    """Cycle seconds by batch size and depth with each size's at most any larger size's at
    the same depth (a cycle over more rows does all one over fewer does and more; a figure
    above a larger batch's was timed while something else ran). Seen: warm-ups of the demo
    kept 6.7 ms for depth 0 at 3 rows against 5.1 at 4, and 7.2 against 7.0."""
    out = {int(r): {int(d): float(t) for d, t in by.items()} for r, by in costs.items()}
    for d in {d for by in out.values() for d in by}:
        low = float("inf")
        for r in sorted(out, reverse=True):
            if d in out[r]:
                low = out[r][d] = min(low, out[r][d])
    return dict(sorted(out.items()))


def _generation_suffixes(model) -> tuple[tuple[int, ...], ...]:
    """The token ids a chat template adds for the reply (with thinking off, on and unset;
    longest first): the render of one user message with and without the generation prompt,
    less their common start. () for a model without a template (raw prompts)."""
    out: set[tuple[int, ...]] = set()
    msgs = [{"role": "user", "content": "Hi"}]
    for thinking in (False, True, None):
        try:
            bare = model.chat_ids(msgs, enable_thinking=thinking, add_generation_prompt=False)
            full = model.chat_ids(msgs, enable_thinking=thinking)
        except Exception:  # noqa: BLE001 - no template (or a broken one): no checkpoint
            log.debug("no generation prompt for %s", model.info.path, exc_info=True)
            continue
        if full[:len(bare)] == bare and len(full) > len(bare):
            out.add(tuple(full[len(bare):]))
    return tuple(sorted(out, key=len, reverse=True))


def _saved_hint(info) -> tuple[dict[int, dict[int, float]], list[float]]:
    """(costs, acceptance) an earlier warm-up of this model measured on this machine
    (``store.write_warm_hint``); empty when none was saved or it cannot be read."""
    try:
        hint = store.read_warm_hint(info.path, info.dtype) or {}
        costs = {int(r): {int(d): float(t) for d, t in by.items() if float(t) > 0}
                 for r, by in (hint.get("cost") or {}).items()}
        acceptance = [min(max(float(a), 0.0), 1.0) for a in hint.get("acceptance") or []]
        return costs, acceptance
    except Exception:  # noqa: BLE001 - a missing or corrupt file only costs the first replies
        log.debug("no saved warm-up hint for %s", info.path, exc_info=True)
        return {}, []


def _saved_counts(info) -> "draft_vocab.TokenCounts":
    """The token counts an earlier process saved for these weights (empty when none)."""
    try:
        return draft_vocab.TokenCounts.from_json(store.read_token_counts(info.path) or {})
    except Exception:  # noqa: BLE001 - a corrupt file only costs the learnt ranking
        log.debug("no saved token counts for %s", info.path, exc_info=True)
        return draft_vocab.TokenCounts()


def _tuned(model) -> dict | None:
    """The saved tuning's starting state for ``depth="auto"`` (None: none saved)."""
    try:
        return (store.read_tuned(model.info.path) or {}).get("adaptive_initial")
    except Exception:  # noqa: BLE001 - a missing/corrupt tuning file only costs warm-up
        log.debug("no saved tuning for %s", model.info.path, exc_info=True)
        return None


_ALL: "weakref.WeakKeyDictionary[object, Carryover]" = weakref.WeakKeyDictionary()


def carryover_of(model) -> Carryover:
    """The carryover ``model``'s replies share (made on first use, dropped with the model)."""
    c = _ALL.get(model)
    if c is None:
        c = _ALL[model] = Carryover.for_model(model)
    return c
