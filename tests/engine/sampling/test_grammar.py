"""Structured-output masks (engine.sampling.grammar) on the demo model's real tokenizer."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.core.carryover import carryover_of
from engine.errors import GenerationError
from engine.sampling.grammar import Constraint

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def demo():
    import engine
    from engine.resources import default_model_path

    return engine.load(default_model_path())


def _constraint(demo, fmt):
    return Constraint.for_format(demo.tokenizer, fmt, vocab_size=demo.info.vocab_size,
                                 eos_ids=demo.info.eos_token_ids)


def test_text_format_is_no_constraint(demo):
    assert _constraint(demo, {"type": "text"}) is None


def test_schema_masks_follow_a_valid_document_and_allow_eos_only_at_the_end(demo):
    c = _constraint(demo, {"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    ids = demo.tokenizer.encode('{"a": 12}', add_special_tokens=False)
    eos = demo.info.eos_token_ids[0]
    first = c.allowed()
    assert first.shape == (demo.info.vocab_size,) and first.dtype == bool
    firsts = [demo.tokenizer.decode([i]) for i in np.nonzero(first)[0]]
    # the object's opening only: "{", or '{"' where the vocabulary merged them (the demo
    # trained with tool chats has that token)
    assert firsts and all(t in ("{", '{"') for t in firsts), firsts
    rows = c.allowed_rows(ids)
    assert rows.shape == (len(ids) + 1, demo.info.vocab_size)
    assert all(rows[i][t] for i, t in enumerate(ids))          # the document is allowed
    assert not any(rows[i][eos] for i in range(len(ids)))      # no early end
    assert rows[-1][eos] and rows[-1].sum() == 1               # then only EOS
    assert np.array_equal(c.allowed(), first)                  # tentative tokens rolled back
    c.advance(ids)
    assert c.allowed()[eos]


def test_refused_draft_ends_the_rows_without_moving_the_state(demo):
    c = _constraint(demo, {"type": "json_object"})
    bad = demo.tokenizer.encode("x", add_special_tokens=False)
    rows = c.allowed_rows(bad + bad)
    assert not rows[0][bad[0]] and np.array_equal(rows[1], rows[0])
    assert np.array_equal(c.allowed(), rows[0])
    with pytest.raises(GenerationError, match="does not follow the grammar"):
        c.advance(bad)


@pytest.mark.parametrize("fmt, message", [
    ({"type": "yaml"}, "not supported"),
    ({"type": "json_schema", "json_schema": {}}, "must be a JSON schema"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}, "cannot be used"),
    ("json", "must be an object"),
])
def test_bad_formats_are_clear_errors(demo, fmt, message):
    with pytest.raises(GenerationError, match=message):
        _constraint(demo, fmt)


def test_json_object_accepts_nested_documents(demo):
    c = _constraint(demo, {"type": "json_object"})
    doc = json.dumps({"k": [1, {"x": "y"}], "z": None})
    ids = demo.tokenizer.encode(doc, add_special_tokens=False)
    rows = c.allowed_rows(ids)
    assert all(rows[i][t] for i, t in enumerate(ids))


BOUNDED = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "tag"],
           "properties": {"ok": {"type": "boolean"},
                          "n": {"type": "integer", "minimum": 0, "maximum": 999},
                          "tag": {"type": "string", "maxLength": 12}}}


def _valid(doc: dict) -> bool:
    return (set(doc) == {"ok", "n", "tag"} and isinstance(doc["ok"], bool)
            and isinstance(doc["n"], int) and 0 <= doc["n"] <= 999
            and isinstance(doc["tag"], str) and len(doc["tag"]) <= 12)


def _run(demo, depth, **kw):
    ids = demo.chat_ids([{"role": "user", "content": "What does `os.path.join` do?"}],
                        enable_thinking=False)
    c = _constraint(demo, {"type": "json_schema", "json_schema": {"schema": BOUNDED}})
    carryover_of(demo).reset_prompt_cache()
    toks, text, reason = [], "", None
    for ev in demo.generate(ids, max_tokens=96, depth=depth, constraint=c, **kw):
        toks += ev.token_ids
        text += ev.text
        reason = ev.finish_reason or reason
    return toks, text, reason


def test_greedy_constrained_speculation_equals_constrained_plain_decoding(demo):
    plain, text, reason = _run(demo, 0)
    assert reason == "stop" and _valid(json.loads(text)), text
    for depth in (1, 2, 3, "auto"):
        assert _run(demo, depth)[0] == plain, depth


@pytest.mark.parametrize("depth", [0, 2])
def test_sampled_constrained_output_always_validates(demo, depth):
    from engine.types import SamplingParams

    for seed in range(6):
        _toks, text, reason = _run(demo, depth, seed=seed,
                                   sampling=SamplingParams(temperature=0.9, top_p=0.95, top_k=20))
        assert reason == "stop" and _valid(json.loads(text)), (seed, text)


def test_seeded_sampling_with_a_constraint_is_the_same_at_depth_0_each_time(demo):
    from engine.types import SamplingParams

    params = SamplingParams(temperature=0.8)
    assert _run(demo, 0, seed=11, sampling=params)[0] == _run(demo, 0, seed=11, sampling=params)[0]
