"""Byte-level BPE tokenizer with Qwen's chat tokens and a Qwen3-style chat template.

Saved as ``tokenizer.json`` + ``tokenizer_config.json`` (chat template included), loadable with
``transformers.AutoTokenizer.from_pretrained(dir)`` without remote code. Pre-tokenisation is
Qwen's (the same split regex, NFC, byte-level), so the chat path is the one real models take.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK = "<think>"
END_THINK = "</think>"
# Order fixes the ids: <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2, <think>=3, </think>=4.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    (ENDOFTEXT, True), (IM_START, True), (IM_END, True), (THINK, False), (END_THINK, False))

PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
    r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

# Qwen3-style: system/user/assistant turns as <|im_start|>role\n...<|im_end|>\n. An assistant
# turn after the last user message keeps its (possibly empty) think block; earlier ones drop it.
# With enable_thinking false the generation prompt ends with an empty think block.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'system' or message.role == 'user' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning = '' %}"
    "{%- if message.reasoning_content is string %}"
    "{%- set reasoning = message.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}"
    "{%- set content = content.split('</think>')[-1] %}"
    "{%- endif %}"
    "{%- set reasoning = reasoning.strip('\\n') %}"
    "{%- set content = content.lstrip('\\n') %}"
    "{%- if loop.index0 > ns.last_user %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content"
    " + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def render_chat(messages: list[dict], *, add_generation_prompt: bool = False,
                enable_thinking: bool | None = None) -> str:
    """Render ``messages`` with :data:`CHAT_TEMPLATE` the way transformers does."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    return env.from_string(CHAT_TEMPLATE).render(
        messages=messages, add_generation_prompt=add_generation_prompt, **kwargs)


def train_tokenizer(texts: Iterable[str], *, vocab_size: int):
    """A byte-level BPE trained on ``texts``; the same texts give the same tokenizer.

    Merges come from :mod:`engine.training.bpe` (``tokenizers``' own trainer breaks ties in a
    per-process random order); the runtime pieces are ``tokenizers``' own.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    from engine.training.bpe import train_bpe

    normalizer = normalizers.NFC()
    pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    specials = [t for t, _ in ADDED_TOKENS]
    vocab, merges = train_bpe(texts, vocab_size=vocab_size,
                              alphabet=pre_tokenizers.ByteLevel.alphabet(), specials=specials,
                              normalizer=normalizer, pre_tokenizer=pre_tokenizer)
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False,
                        byte_fallback=False))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def token_ids(tok) -> dict[str, int]:
    """Ids of the chat tokens in a trained tokenizer."""
    return {t: tok.token_to_id(t) for t, _ in ADDED_TOKENS}


def save_tokenizer(tok, out_dir: Path, *, model_max_length: int) -> None:
    """Write ``tokenizer.json`` (think tokens not special) and ``tokenizer_config.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = json.loads(tok.to_str())
    special = dict(ADDED_TOKENS)
    for added in data["added_tokens"]:
        added["special"] = special.get(added["content"], True)
    (out_dir / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False, indent=1),
                                            encoding="utf-8")
    decoder = {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                 "single_word", "special")}
               for a in data["added_tokens"]}
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "extra_special_tokens": [],
        "model_max_length": model_max_length,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n",
                                                   encoding="utf-8")
