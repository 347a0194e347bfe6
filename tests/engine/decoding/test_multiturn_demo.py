"""Issue 35 item 14: a multi-turn chat on the embedded demo reaches the model exactly as the
chat template renders it, and the prompt cache never changes a reply.

The symptom ("asked about ``itertools.chain`` after ``json.dumps``, the demo answered with
json's text") is the demo's, not the prompt's: a chat past the 256-token windows the demo was
trained on gets the same answer from an independent implementation of the same weights
(transformers' Qwen3.5 modeling in torch, no cache) fed the template's token ids. See
docs/newcomer.md, "Item 14".
"""
from __future__ import annotations

import pytest

import engine
from engine.core.carryover import Carryover
from engine.resources import default_model_path
from engine.types import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
EARLIER = ["What does `json.dumps` do?", "What does `os.path.join` do?",
           "What does `re.sub` do?", "What does `math.floor` do?"]
CHAIN = "What does `itertools.chain` do?"


@pytest.fixture(scope="module")
def demo():
    path = default_model_path()
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"the embedded demo model is missing: {path}")
    return engine.load(path)


def _reply(model, ids, carry, *, depth="auto", max_tokens=2048):
    out, prefill = [], None
    for ev in model.generate(ids, max_tokens=max_tokens, depth=depth, sampling=GREEDY,
                             carryover=carry):
        prefill = ev.prefill or prefill
        out += ev.token_ids
    return out, prefill


def _chat(model, questions, carry):
    """The app's history (``ChatSession.history``): each reply's text goes back as the
    assistant's turn; returns the messages with the last question appended, unanswered."""
    msgs = []
    for q in questions[:-1]:
        msgs.append({"role": "user", "content": q})
        ids, _ = _reply(model, model.chat_ids(msgs, enable_thinking=False), carry)
        msgs.append({"role": "assistant",
                     "content": model.tokenizer.decode(ids, skip_special_tokens=True)})
    return msgs + [{"role": "user", "content": questions[-1]}]


def test_second_turn_is_answered_the_same_with_and_without_the_prompt_cache(demo):
    carry = Carryover()                       # shared by both turns: the prompt cache is on
    msgs = _chat(demo, [EARLIER[0], CHAIN], carry)
    ids = demo.chat_ids(msgs, enable_thinking=False)
    text = demo.tokenizer.decode(ids)
    assert text.count("<|im_start|>user\n") == 2 and text.endswith(
        f"{CHAIN}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    cached, _ = _reply(demo, ids, carry, max_tokens=40)
    fresh, prefill = _reply(demo, ids, Carryover(), max_tokens=40)
    plain, _ = _reply(demo, ids, Carryover(), depth=0, max_tokens=40)
    assert cached == fresh == plain
    assert prefill.reused_tokens == 0 and prefill.prompt_tokens == len(ids)
    # within the demo's 256-token training window it answers the question it was asked
    assert demo.tokenizer.decode(cached).startswith("`itertools.chain`\n\n")


def test_past_its_training_window_the_demo_itself_answers_from_the_history(demo):
    """The chat of the report, four turns (338 tokens): the engine, with the cache carried
    over every turn, answers ``itertools.chain`` with ``json.dump``'s docstring, and so does
    transformers' modeling of the same weights, uncached, on the same token ids."""
    torch = pytest.importorskip("torch")
    from engine.training.reference import load_model

    carry = Carryover()
    ids = demo.chat_ids(_chat(demo, EARLIER + [CHAIN], carry), enable_thinking=False)
    assert len(ids) > 256
    got, _ = _reply(demo, ids, carry, max_tokens=6)
    with torch.no_grad():  # one forward over prompt + reply: its greedy picks at each step
        _, logits = load_model(default_model_path()).trunk_forward(torch.tensor([ids + got]))
    assert logits[0, len(ids) - 1:-1].argmax(-1).tolist() == got
    assert demo.tokenizer.decode(got).startswith("`json.dump")
