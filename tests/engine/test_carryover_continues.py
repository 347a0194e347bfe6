"""``Carryover.continues``: whether a lone ``auto`` request's prompt continues the conversation
of the one before it (its depth controller then keeps that reply's acceptance behind the new
one's)."""
from __future__ import annotations

from engine.core.carryover import CONTINUE_TAIL, Carryover


def test_a_prompt_that_extends_the_last_one_continues_it():
    c = Carryover()
    first = list(range(100))
    assert not c.continues(first)  # nothing before it
    assert c.continues(first + [7] * 50)  # an agent's next turn: the whole prompt, then more
    # the last turn's generation prompt (its last tokens) may render differently once answered
    second = first + [7] * 50
    assert c.continues(second[:-CONTINUE_TAIL] + [9] * (CONTINUE_TAIL + 20))


def test_another_conversation_or_a_shorter_prompt_does_not():
    c = Carryover()
    c.continues(list(range(100)))
    assert not c.continues([5] + list(range(1, 200)))  # differs early: a new conversation
    assert not c.continues(list(range(50)))  # shorter: not a continuation of 100 tokens
    assert c.continues(list(range(50)))  # the same prompt again: a regenerated reply
    c.continues(list(range(CONTINUE_TAIL)))  # too short to tell
    assert not c.continues(list(range(CONTINUE_TAIL + 10)))


def test_the_decoder_tells_the_controller_a_conversation_goes_on(tiny_model):
    """``BatchDecoder.add`` of a lone ``auto`` request asks ``continues``: the next turn of a
    conversation keeps the last reply's acceptance evidence, another conversation's does not."""
    from engine.decoding.decoder import BatchDecoder

    carry = Carryover()
    first = list(range(5, 80))
    for _ in tiny_model.generate(first, max_tokens=24, depth="auto", carryover=carry):
        pass
    ctrl = carry.controller(tiny_model, 1)
    seen = ctrl._acc.reply[0].weight + ctrl._acc.reply_open[0].weight
    assert seen > 0  # the reply drafted

    dec = BatchDecoder(tiny_model, carryover=carry, max_streams=1)
    dec.add(first + [9] * 20, max_tokens=8, depth="auto")  # the same conversation's next turn
    kept = ctrl._acc.reply[0].weight + ctrl._acc.reply_open[0].weight
    assert 0 < kept <= min(seen, 2 * 4.0)
    dec.close()

    dec = BatchDecoder(tiny_model, carryover=carry, max_streams=1)
    dec.add(list(range(200, 320)), max_tokens=8, depth="auto")  # another conversation
    assert ctrl._acc.reply[0].weight + ctrl._acc.reply_open[0].weight == 0
    dec.close()
