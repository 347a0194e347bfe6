"""The prompt-cache checkpoint (the state before the chat template's generation prompt) is
taken inside the prompt's last forward (``Session.prefill_chunks``'s ``mark``): one forward
instead of two, the same state, the same replies."""
from __future__ import annotations

import numpy as np
import pytest

from engine.core.carryover import Carryover
from engine.decoding.session import Session, Snapshot
from tests.engine.decoding.test_multiturn_demo import GREEDY, demo  # noqa: F401 - the fixture


def _count_forwards(model, monkeypatch) -> list:
    calls = []
    real = model.forward_hidden

    def counted(inputs, cache, **kw):
        calls.append((inputs.shape[1], kw.get("mark")))
        return real(inputs, cache, **kw)
    monkeypatch.setattr(model, "forward_hidden", counted)
    return calls


def _arrays(snap: Snapshot) -> list[np.ndarray]:
    """Every array of the state a snapshot resumes (attention caches up to their offset)."""
    out = []
    for state in (snap.trunk_state, snap.mtp_state or []):
        for s in state:
            if s[0] == "kv":
                out += [np.array(s[1][..., :s[3], :]), np.array(s[2][..., :s[3], :])]
            else:
                out += [np.array(a) for a in s[1]]
    return out + [np.array(snap.last_hidden)]


def _prefill(model, tokens, mark):
    s = Session.fresh(model, use_mtp=True)
    for _ in s.prefill_chunks(tokens, mark=mark):
        pass
    return s


def test_the_mark_is_taken_inside_one_forward_with_the_state_of_two(demo, monkeypatch):
    ids = demo.chat_ids([{"role": "user", "content": "What does `os.path.join` do?"}],
                        enable_thinking=False)
    cut = Carryover().checkpoint(demo, ids)
    assert cut is not None and 8 <= cut < len(ids)
    calls = _count_forwards(demo, monkeypatch)
    inside = _prefill(demo, ids, cut)
    assert calls == [(len(ids), cut)]
    split_calls = len(calls)
    monkeypatch.setattr(demo, "marks", lambda tokens, images=False: False)
    split = _prefill(demo, ids, cut)
    assert [c[0] for c in calls[split_calls:]] == [cut, len(ids) - cut]
    a, b = inside.marked, split.marked
    assert a.fed == b.fed == tuple(ids[:cut])
    assert a.mtp_rows == b.mtp_rows == cut - 1 and a.pending_tok == b.pending_tok == ()
    assert a.last_logits is None
    for x, y in zip(_arrays(a), _arrays(b), strict=True):
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
    # and the prompt's end: the same state as well
    for x, y in zip(_arrays(inside.snapshot()), _arrays(split.snapshot()), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_a_prompt_that_ends_at_the_checkpoint_is_never_answered_from_stale_logits(demo):
    """The checkpoint's snapshot carries no logits (it was never the end of a prompt), so a
    prompt that stops exactly there prefills its last token again instead of drawing from
    another position's logits."""
    ids = demo.chat_ids([{"role": "user", "content": "What does `re.sub` do?"}],
                        enable_thinking=False)
    carry = Carryover()
    list(demo.generate(ids, max_tokens=4, depth=3, sampling=GREEDY, carryover=carry))
    cut = carry.checkpoint(demo, ids)
    head = ids[:cut]
    resumed = [t for ev in demo.generate(head, max_tokens=8, depth=3, sampling=GREEDY,
                                         carryover=carry) for t in ev.token_ids]
    fresh = [t for ev in demo.generate(head, max_tokens=8, depth=0, sampling=GREEDY,
                                       carryover=Carryover()) for t in ev.token_ids]
    assert resumed == fresh


def test_a_mark_with_images_is_refused(demo):
    s = Session.fresh(demo, use_mtp=True)
    with pytest.raises(ValueError, match="images"):
        next(s.prefill_chunks([1, 2, 3], images=(object(),), mark=1))
