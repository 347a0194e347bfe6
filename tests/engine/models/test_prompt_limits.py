"""``engine.models.prompt_limits``: exactly ``tokenizer.encode`` when a prompt fits, a refusal with
the numbers when it does not, never the whole of a long text at once, pieces that join back
(issue 27, item 1; the server's side is tests/server/test_prompt_limits.py)."""
from __future__ import annotations

import itertools

import pytest

from engine.errors import PromptTooLongError
from engine.models.prompt_limits import (
    PIECE_CHARS, encode_bounded, kv_bytes_per_token, longest_token_chars, pieces, prompt_limit)


@pytest.fixture(scope="module")
def demo_tokenizer():
    from transformers import AutoTokenizer

    import engine

    return AutoTokenizer.from_pretrained(str(engine.default_model_path()))


@pytest.fixture(scope="module")
def reference():
    import engine

    return engine.load(engine.default_model_path())


TEXTS = [
    "hello world",
    "word " * 70_000,                                   # > PIECE_CHARS: counted in pieces
    ("def f(x):\n    return x + 1\n\n" * 12_000),       # newlines: cut after them
    ("naïve café 東京 e\u0301 " * 30_000),              # NFC and multi-byte text
    ("x" * (PIECE_CHARS + 10)),                         # no newline or space to cut at
]


@pytest.mark.parametrize("i", range(len(TEXTS)))
def test_encode_bounded_is_the_tokenizers_encoding_when_it_fits(demo_tokenizer, i):
    text = TEXTS[i]
    want = demo_tokenizer.encode(text, add_special_tokens=False)
    assert encode_bounded(demo_tokenizer, text, limit=len(want)) == want
    assert encode_bounded(demo_tokenizer, text, limit=None) == want


@pytest.mark.parametrize("i", range(len(TEXTS)))
def test_encode_bounded_refuses_one_token_over(demo_tokenizer, i):
    text = TEXTS[i]
    n = len(demo_tokenizer.encode(text, add_special_tokens=False))
    with pytest.raises(PromptTooLongError, match=f"more than the {n - 1:,}"):
        encode_bounded(demo_tokenizer, text, limit=n - 1, context=n)


def test_pieces_join_back_and_cut_where_pretokenizers_split():
    text = "".join(TEXTS)
    got = list(pieces(text, 4096))
    assert "".join(got) == text
    assert all(0 < len(p) <= 4096 for p in got)
    for a, b in itertools.pairwise(got):
        assert a.endswith("\n") or b.startswith(" ") or (a[-1] == "x" == b[0])


class _CountingTokenizer:
    """One token per character, one vocabulary entry of 1,000 characters (so the cheap
    bound cannot refuse), recording how much text it was given at once."""

    def __init__(self) -> None:
        self.largest = 0

    def get_vocab(self):
        return {"a": 0, "b" * 1000: 1}

    def encode(self, text, add_special_tokens=False):
        self.largest = max(self.largest, len(text))
        return [0] * len(text)


def test_a_long_text_over_the_limit_is_never_tokenized_whole():
    tok = _CountingTokenizer()
    text = "ab " * (4 * PIECE_CHARS)
    with pytest.raises(PromptTooLongError, match="at least"):
        encode_bounded(tok, text, limit=PIECE_CHARS)
    assert tok.largest <= PIECE_CHARS
    tok.largest = 0
    with pytest.raises(PromptTooLongError, match="at least 3,000,002"):  # the cheap bound
        encode_bounded(_Short(), "a" * 12_000_008, limit=3_000_000)


class _Short(_CountingTokenizer):
    def get_vocab(self):
        return {"a": 0}

    def encode(self, text, add_special_tokens=False):
        raise AssertionError("the cheap bound refuses before any tokenizing")


def test_longest_token_counts_added_tokens(demo_tokenizer):
    assert longest_token_chars(demo_tokenizer) >= len("<|im_start|>")


def test_prompt_limit_is_the_context_or_what_memory_holds():
    assert prompt_limit(8192, 1000, available=10**12) == 8191
    # 100 MB available, 80 % of it at 1000 + 1024 bytes a token
    assert prompt_limit(262_144, 1000, available=100 * 10**6) == 80 * 10**6 // 2024


def test_kv_bytes_per_token_of_the_demo(reference):
    # 2 full-attention layers x 2 KV heads x 64 dims x (K and V) x float32
    assert kv_bytes_per_token(reference.trunk) == 2 * 2 * 2 * 64 * 4


def test_too_long_chat_prompt_names_memory_when_memory_limits(reference, monkeypatch):
    import engine.models.prompt_limits as pl

    monkeypatch.setattr(pl, "available_memory", lambda: 2_000_000)
    limit = reference.prompt_limit()
    assert limit < reference.info.context_length - 1
    with pytest.raises(PromptTooLongError, match="memory available now"):
        reference.chat_ids([{"role": "user", "content": "word " * (2 * limit)}])


