"""Bad arguments to the public API fail fast with one-line ``GenerationError``s that name the
parameter (issue 12, defects 1 and 7), before anything reaches MLX."""
from __future__ import annotations

import math

import pytest

from engine import SamplingParams
from engine.errors import EngineError, GenerationError


@pytest.mark.parametrize("kwargs,name", [
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"temperature": "0.5"}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": math.nan}, "top_p"),
    ({"top_k": -3}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"top_k": True}, "top_k"),
    ({"min_p": 2.0}, "min_p"),
    ({"min_p": 1.0}, "min_p"),
    ({"min_p": -0.1}, "min_p"),
    ({"min_p": math.nan}, "min_p"),
    ({"presence_penalty": math.nan}, "presence_penalty"),
    ({"frequency_penalty": -math.inf}, "frequency_penalty"),
    ({"frequency_penalty": None}, "frequency_penalty"),
])
def test_sampling_params_reject_bad_values(kwargs, name):
    with pytest.raises(GenerationError) as err:
        SamplingParams(**kwargs)
    msg = str(err.value)
    assert msg.startswith(name) and "\n" not in msg
    assert isinstance(err.value, ValueError) and isinstance(err.value, EngineError)


def test_sampling_params_accept_edges():
    SamplingParams(temperature=0, top_p=1, top_k=0, min_p=0.0)
    SamplingParams(temperature=2.0, top_p=1e-6, top_k=1, min_p=0.999, presence_penalty=-2,
                   frequency_penalty=2)


@pytest.mark.parametrize("ids,needle", [
    ([1, 2, 1_000_000_000], "prompt_ids[2]"),
    ([1, -1, 3], "prompt_ids[1]"),
    ([2 ** 63], "prompt_ids[0]"),
    ([1, 2.0], "prompt_ids[1]"),
    ([1, "7"], "prompt_ids[1]"),
    ([True], "prompt_ids[0]"),
    ("hello", "string"),
    ([], "empty"),
])
def test_prompt_ids_are_checked_before_mlx(tiny_model, ids, needle):
    with pytest.raises(GenerationError) as err:
        tiny_model.generate(ids, max_tokens=4)  # raises at the call, not at the first event
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_prompt_ids_at_the_vocabulary_edge(tiny_model):
    v = tiny_model.info.vocab_size
    with pytest.raises(GenerationError, match=f"0 to {v - 1}"):
        tiny_model.generate([1, v], max_tokens=2)
    events = list(tiny_model.generate([1, v - 1], max_tokens=2))
    assert events[-1].finish_reason is not None


@pytest.mark.parametrize("kwargs,name", [
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"stop_strings": "the"}, "stop_strings"),
    ({"stop_strings": ("a", 3)}, "stop_strings"),
    ({"depth": 9}, "depth"),
    ({"depth": -1}, "depth"),
    ({"depth": 1.5}, "depth"),
    ({"depth": "deep"}, "depth"),
    ({"sampling": {"temperature": 1}}, "sampling"),
    ({"draft_mode": "beam"}, "draft_mode"),
])
def test_generate_arguments_are_checked(tiny_model, kwargs, name):
    args = {"max_tokens": 4, **kwargs}
    with pytest.raises(GenerationError) as err:
        tiny_model.generate([1, 2, 3], **args)
    assert name in str(err.value) and "\n" not in str(err.value)


def test_cli_prompt_ids_must_be_integers():
    from engine.commands.generate import parse_ids

    assert parse_ids("1, 2,3") == [1, 2, 3]
    with pytest.raises(GenerationError, match="--prompt-ids"):
        parse_ids("1,x,3")
