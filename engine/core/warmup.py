"""Warm-up: compile the shapes a model's batches will use before a request needs them.

Every new (rows, draft depth) pair runs graphs MLX has not seen: the trunk's compiled layers
(``engine.models.trunk``: one ``mx.compile`` per input shape), the verify forward over
(rows, depth + 1) tokens, the MTP head's steps, the plain step, the compiled draws. Each
compiles on first use, so a fresh process's first burst of streams, or its first reply at a
depth, pays for it in the middle of the reply. ``WarmUp`` runs those shapes ahead, through
the real decoder (so exactly the graphs a request will run are made), on a private
``Carryover`` (the prompt cache, the disk cache and the depth controllers never see it).

Contract:
- ``WarmUp(model, max_streams=..., depths=...)`` plans one unit per (depth, sampling): a batch
  grown one row at a time up to ``max_streams`` rows at that fixed depth, each row count run
  for two cycles (the first compiles; in a greedy unit the fastest of the later cycles at that
  row count is its cost). Row i asks ``QUESTIONS[i % 4]``: the acceptance is pooled over four
  chat questions, not one. (Two timed cycles per row count did not steady the costs and made
  the warm-up 1.5-1.7x as long: docs/benchmarks.md, nineteenth session.)
- The timed cycles of the greedy units, and the acceptance by draft position their rows
  saw, are handed to the model's shared carryover (``Carryover.hint``) after each greedy
  unit and when the warm-up ends: a depth controller made afterwards for a batch size starts
  from what a cycle at each depth costs at that size and from this model's acceptance, so a
  fresh process's batches choose their depth without a warm-up schedule of their own, as a
  warm one's do. The figures are also kept per model, dtype and machine
  (``store.write_warm_hint``), and the next process's carryover starts from them before its
  own warm-up has run (a burst at the instant a server listens). (Without the acceptance a fresh controller's prior, 0.6 falling by
  position, chose depth 1-2 for the demo's first 4-stream burst: 1.5-2.0 tokens a cycle
  against 2.6-3.9 in the bursts after.)
- First, one step per row count from ``max_streams`` down to 2: the warm-up's prompt that many
  times prefilled together (``engine.decoding.together``: what a burst of new requests runs),
  so its shapes are compiled too; these steps are not counted in ``done``/``total``.
- ``step()`` runs ONE decoder step (at most one prefill chunk of a few tokens and one cycle)
  and returns whether more remain: the host calls it only while no request waits, so a request
  never waits for more than one warm-up cycle, and never for the whole warm-up.
- ``done``/``total`` count (rows, depth, sampling) cells covered; ``on_progress(done, total)``
  is called after each step that covered a new one (and once at the end). ``cancel()`` stops
  it (``finished`` becomes True; what was compiled stays compiled). Errors end the warm-up
  quietly (logged): it never costs a request.
- Exactness is untouched: it only runs the decoder; what it leaves behind is MLX's compiled
  graphs, which compute the same values warm or cold.

``MTP_WARMUP=0`` in the environment turns it off (``enabled()``), for A/B measurements
(``python -m engine.bench.cold_start``).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from engine.types import SamplingParams

log = logging.getLogger(__name__)

ENV = "MTP_WARMUP"
# the depths ``depth="auto"`` visits first, then the rest of its range (auto tries 0..4)
DEFAULT_DEPTHS = (3, 2, 1, 0, 4)
PROMPT = "def main():\n    items = [1, 2, 3]\n    for"  # for a model without a chat template
# A chat model's warm-up decodes chat turns, so the acceptance it sees is a chat reply's
# (the demo accepted 5 % of its drafts on ``PROMPT``, which is not what it is asked). Several
# questions, one a row: one question's reply is one sample of a head's acceptance (the demo
# accepted 0.67 at position 1 on the first and 0.55-0.88 on three others, measured).
QUESTIONS = ("What does Python's built-in sorted function do? Give a short example.",
             "Explain what a hash table is in two sentences.",
             "Write a Python function that reverses a string.",
             "What is the difference between a list and a tuple?")
GREEDY = SamplingParams(temperature=0.0)


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class WarmUp:
    """See the module docstring. Not thread-safe: the model's thread calls ``step``;
    ``cancel`` and the counters may be read from any thread."""

    def __init__(self, model, *, max_streams: int, depths: tuple[int, ...] | None = None,
                 samplings: tuple[SamplingParams, ...] = (GREEDY, SamplingParams()),
                 on_progress: Callable[[int, int], None] | None = None) -> None:
        from engine.core.carryover import Carryover, carryover_of

        info = model.info
        if depths is None:
            depths = DEFAULT_DEPTHS if info.has_mtp else (0,)
        self.model = model
        self.max_streams = max(1, int(max_streams))
        self.units = [(d, s) for s in samplings for d in depths if d <= max(info.max_depth, 0)]
        self.total = len(self.units) * self.max_streams
        self.done = 0
        self.on_progress = on_progress
        self.started_at: float | None = None
        self.seconds = 0.0
        # its own prompt cache and controllers, but the model's draft-vocabulary ranking: the
        # set it compiles for is the one replies use (not rebuilt by the first reply)
        self._carry = Carryover(token_counts=carryover_of(model).token_counts, learns=False)
        self._prompts = _prompts(model)  # the first: what prefill-together shapes compile with
        self._cancel = threading.Event()
        self._unit = 0
        self._dec = None
        self._covered: set[int] = set()
        self._added = 0  # rows added in the current unit (which question the next one asks)
        self._cycles: dict[int, int] = {}
        self.costs: dict[int, dict[int, float]] = {}  # rows -> depth -> seconds (greedy units)
        # per draft position: [times reached, times accepted] over the greedy units' rows
        self.tally: list[list[int]] = [[0, 0] for _ in range(max(depths, default=0))]
        self._steps = 0
        self._together = (_together_rows(model, self._prompts[0], self.max_streams)
                          if self.units else [])
        self.finished = not self.units

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def fraction(self) -> float:
        return 1.0 if not self.total else self.done / self.total

    def step(self) -> bool:
        """One decoder step of the warm-up; whether more remain (see the module docstring)."""
        if self.finished:
            return False
        if self._cancel.is_set():
            return self._stop()
        t0 = time.perf_counter()
        if self.started_at is None:
            self.started_at = t0
        try:
            more = self._advance()
        except Exception:  # noqa: BLE001 - a warm-up never costs a request
            log.warning("warm-up stopped", exc_info=True)
            more = self._stop()
        self.seconds += time.perf_counter() - t0
        return more

    def _advance(self) -> bool:
        if self._together:
            _prefill_together(self.model, self._prompts[0], self._together.pop(0), self._carry)
            return True
        depth, params = self.units[self._unit]
        dec = self._dec
        if dec is None:
            dec = self._dec = self.model.decoder(max_streams=self.max_streams,
                                                 carryover=self._carry)
            self._covered, self._steps, self._cycles, self._added = set(), 0, {}, 0
        rows = len(dec.active)
        if dec.room > 0 and not dec.waiting and (rows == 0 or self._cycles.get(rows, 0) >= 2):
            dec.add(self._prompts[self._added % len(self._prompts)],
                    max_tokens=8 * (self.max_streams + 2) * (depth + 1), depth=depth,
                    sampling=params, seed=self._steps)  # one row more
            self._added += 1
        dec.admit_step()
        rows = len(dec.active)
        t0 = time.perf_counter()
        events = dec.cycle_step()
        seconds = time.perf_counter() - t0
        if params.temperature == 0 and depth > 0:
            self._count(events)
        self._steps += 1
        before = len(self._covered)
        if rows:
            self._cycles[rows] = n = self._cycles.get(rows, 0) + 1
            if n >= 2:
                self._covered.add(rows)
                if params.temperature == 0:
                    self._timed(rows, depth, seconds)
        covered = len(self._covered) > before
        if covered:
            self.done += 1
        if len(self._covered) >= self.max_streams or self._steps > 8 * self.max_streams + 8:
            self.done += self.max_streams - len(self._covered)  # a unit that gave up counts
            self._end_unit()
            if params.temperature == 0 and not self._cancel.is_set():
                self._hint()  # the first unit (depth 3) already tells a burst what to choose
                self._save()
            self._unit += 1
            if self._unit >= len(self.units):
                return self._stop()  # its report (done == total) comes once finished is set
        if covered:
            self._report()
        return True

    def _timed(self, rows: int, depth: int, seconds: float) -> None:
        """A timed greedy cycle: the cell's cost is the fastest of them (a row count comes
        back when a row's reply ends)."""
        by_depth = self.costs.setdefault(rows, {})
        by_depth[depth] = min(seconds, by_depth.get(depth, seconds))

    def _count(self, events) -> None:
        """Tally which draft positions the rows reached and accepted in a cycle."""
        for _, ev in events or ():
            st = getattr(ev, "stats", None)
            if st is None or not st.drafted:
                continue
            for i in range(min(len(st.drafted), len(self.tally))):
                if i > st.accepted:
                    break
                self.tally[i][0] += 1
                self.tally[i][1] += i < st.accepted

    def acceptance(self, min_reached: int = 4) -> list[float]:
        """Conditional acceptance by draft position seen in the greedy units (positions
        reached fewer than ``min_reached`` times, and those after them, left out)."""
        out = []
        for reached, accepted in self.tally:
            if reached < min_reached:
                break
            out.append(accepted / reached)
        return out

    def _hint(self) -> None:
        """Hand what was measured so far to the model's shared carryover (see the module
        docstring): controllers made from now on start from it."""
        from engine.core.carryover import carryover_of

        carryover_of(self.model).hint(self.costs, self.acceptance())

    def _save(self) -> None:
        """Keep the figures for the next process (``store.write_warm_hint``), merged into
        what an earlier process kept (a warm-up cut short by requests or a shutdown still
        adds what it measured); never fails."""
        try:
            from engine.hub import store

            info = self.model.info
            old = store.read_warm_hint(info.path, info.dtype) or {}
            cost = {str(r): dict(by) for r, by in (old.get("cost") or {}).items()
                    if isinstance(by, dict)}
            for r, by in self.costs.items():
                cost.setdefault(str(r), {}).update({str(d): t for d, t in by.items()})
            acceptance = self.acceptance()
            if len(acceptance) < len(old.get("acceptance") or []):
                acceptance = old["acceptance"]
            store.write_warm_hint(info.path, info.dtype,
                                  {"cost": cost, "acceptance": acceptance})
        except Exception:  # noqa: BLE001 - a read-only data dir only costs the next start
            log.debug("could not keep the warm-up's figures", exc_info=True)

    def _end_unit(self) -> None:
        if self._dec is not None:
            self._dec.close()
            self._dec = None

    def _stop(self) -> bool:
        self._end_unit()
        self.finished = True
        self._carry.reset_prompt_cache()
        if (self.costs or self.acceptance()) and not self._cancel.is_set():
            self._hint()
        try:
            import mlx.core as mx

            mx.clear_cache()
        except Exception:  # noqa: BLE001
            pass
        self._report()
        if self.started_at is not None:
            log.info("warm-up %s: %d/%d shapes in %.1f s of steps",
                     "cancelled" if self._cancel.is_set() else "done", self.done, self.total,
                     self.seconds)
        return False

    def _report(self) -> None:
        if self.on_progress is not None:
            try:
                self.on_progress(self.done, self.total)
            except Exception:  # noqa: BLE001 - a broken listener must not stop the worker
                log.exception("warm-up progress listener failed")


def _together_rows(model, ids: list[int], max_streams: int) -> list[int]:
    """The row counts whose prefill-together shapes the warm-up compiles (none where the
    model cannot prefill prompts together)."""
    from engine.decoding import together

    try:
        if not together.supported(model, len(ids)):
            return []
    except Exception:  # noqa: BLE001 - a model without the engine's forward: nothing to do
        return []
    return list(range(max_streams, together.MIN_ROWS - 1, -1))


def _prefill_together(model, ids: list[int], rows: int, carry) -> None:
    """``ids`` prefilled ``rows`` times in one forward, evaluated, and dropped (``carry``: the
    warm-up's carryover, for the checkpoint)."""
    import mlx.core as mx

    from engine.decoding import together
    from engine.decoding.session import Session

    use_mtp = model.mtp is not None
    sessions = [Session.fresh(model, use_mtp=use_mtp) for _ in range(rows)]
    cut = carry.checkpoint(model, ids)
    together.prefill(model, sessions, [list(ids)] * rows, None if cut is None else len(ids) - cut)
    mx.eval([s.last_logits for s in sessions])
    for s in sessions:
        s.settle()


def _prompts(model) -> list[list[int]]:
    """``QUESTIONS`` through the model's chat template (thinking off), else ``PROMPT``."""
    try:
        return [list(model.chat_ids([{"role": "user", "content": q}], enable_thinking=False))
                for q in QUESTIONS]
    except Exception:  # noqa: BLE001 - no template, or a broken one: raw text
        return [list(model.tokenizer.encode(PROMPT))]


def for_model(model, *, max_streams: int,
              on_progress: Callable[[int, int], None] | None = None) -> WarmUp | None:
    """A warm-up for ``model`` (None: turned off, or a model without the engine's decoder,
    such as a scripted fake)."""
    if not enabled() or model is None or not hasattr(model, "decoder") \
            or not hasattr(model, "tokenizer") or not hasattr(model, "trunk"):
        return None
    return WarmUp(model, max_streams=max_streams, on_progress=on_progress)
