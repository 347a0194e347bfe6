"""Structured-output masks (engine.grammar) on the demo model's real tokenizer."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.errors import GenerationError
from engine.grammar import Constraint

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
    assert [demo.tokenizer.decode([i]) for i in np.nonzero(first)[0]] == ["{"]
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
