"""A scripted stand-in for ``engine.Model``: same interface, no weights, deterministic output.

Used by the app's tests, by ``python -m app.bench.ui`` and by the self-test when
``MTPCHAT_SELFTEST_FAKE=1``. It implements what the worker and the engine's scheduler rely on:

- ``FakeModel.info`` (an ``engine.types.ModelInfo``), ``chat_ids(messages, enable_thinking=...)``
  (no tokenizer: one id per character of a rendered transcript); ``chat_prompt(messages)`` the
  same for messages with image parts (a model made with ``fake_model_info(vision=True)``);
- ``decoder(max_streams=N)``: a ``ScriptedDecoder`` (``app.fake.decoder``: the protocol of
  ``engine.decoding.decoder.BatchDecoder``) through which the scheduler runs every request, one
  stream or many: each stream's events are ``PrefillStats`` first, then a ``CycleStats`` per
  cycle and a ``finish_reason`` on the last one; one ``cycle_step`` advances every stream and
  sleeps once, for its longest row (a batched cycle costs about one cycle), so N concurrent
  replies take about as long as one;
- ``generate(prompt_ids, *, max_tokens, depth, sampling, seed, cancel, stop_strings)``: the same
  events for one request, through a one-stream decoder.
- The reply is a script (Markdown with a code block, optionally a ``<think>`` section) cut into
  "tokens" of a few characters, emitted at ``tokens_per_second``; each cycle emits between one
  and ``depth + 1`` tokens, the first ones flagged as accepted drafts.
- ``fail_after`` raises ``error`` after that many tokens; ``cancel`` is checked every cycle.
- ``scripts``: replies to give first, one per request, before falling back to ``script`` (a
  tool loop's steps); ``prompts`` records every rendered message list (what the template got).
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ModelLoadError
from app.fake.decoder import ScriptedDecoder, ScriptedStream, StreamRequest
from engine.types import CycleStats, Event, ModelInfo, PrefillStats, SamplingParams

DEFAULT_SCRIPT = """Here is a short answer with **Markdown** and a code block.

1. It streams token by token.
2. Code blocks are highlighted:

```python
def fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
```

That's all — `fib(10)` returns *55*.
"""

THINK_SCRIPT = ("<think>\nThe user wants an example. I will show a small Python function and "
                "explain it briefly.\n</think>\n\n")


@dataclass(frozen=True)
class FakeVisionInfo(ModelInfo):
    """A fake model's info that says it reads images (``ModelInfo.vision``, for as long as
    the engine's ``ModelInfo`` may not have the field yet)."""

    vision: bool = True


def fake_model_info(path: str = "fake://model", *, supports_thinking: bool = True,
                    has_mtp: bool = True, max_depth: int = 3, vision: bool = False) -> ModelInfo:
    cls = FakeVisionInfo if vision else ModelInfo
    return cls(
        path=path, name="fake-mtp-model", architecture="Qwen3_5ForCausalLM", family="qwen3_5",
        layout="mlx", num_parameters=1_000_000, bytes_on_disk=4_000_000, quantization=None,
        has_mtp=has_mtp, mtp_layers=1 if has_mtp else 0, max_depth=max_depth if has_mtp else 0,
        context_length=32768, vocab_size=256, hidden_size=64, num_layers=2, dtype="float32",
        eos_token_ids=(0,), supports_thinking=supports_thinking)


def split_tokens(text: str, *, size: int = 4) -> list[str]:
    """Cut ``text`` into pseudo-tokens of at most ``size`` characters (words kept together)."""
    out: list[str] = []
    cur = ""
    for ch in text:
        cur += ch
        if len(cur) >= size or ch in " \n":
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return out


@dataclass
class FakeModel:
    """Scripted model. All knobs are plain attributes so tests can change them between calls."""

    info: ModelInfo = field(default_factory=fake_model_info)
    script: str = DEFAULT_SCRIPT
    think: bool | None = None          # None: think when enable_thinking was asked for
    tokens_per_second: float = 2000.0
    prefill_seconds: float = 0.0
    fail_after: int | None = None
    error: Exception | None = None
    repeat_to: int | None = None       # repeat the script until this many tokens
    acceptance: float = 0.7
    calls: list[dict] = field(default_factory=list)
    scripts: list[str] = field(default_factory=list)
    prompts: list[list[dict]] = field(default_factory=list)
    tokenizer: None = None
    _last_thinking: bool = False

    def chat_ids(self, messages: list[dict], *, enable_thinking: bool | None = None,
                 add_generation_prompt: bool = True) -> list[int]:
        self._last_thinking = bool(enable_thinking)
        self.prompts.append([dict(m) for m in messages])
        rendered = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        if add_generation_prompt:
            rendered += "<|assistant|>"
        return [min(ord(c), 255) for c in rendered]

    def chat_prompt(self, messages: list[dict], *, enable_thinking: bool | None = None) -> list[int]:
        """Messages whose content may be a list of parts (``engine.vision``'s contract): each
        image part renders as ``<|image:WxH:digest12|>``, text parts as their text."""
        def text_of(content) -> str:
            if isinstance(content, str):
                return content
            return "".join(p["text"] if p["type"] == "text" else
                           f"<|image:{p['image'].width}x{p['image'].height}:"
                           f"{p['image'].digest[:12]}|>" for p in content)
        self._last_thinking = bool(enable_thinking)
        self.prompts.append([dict(m) for m in messages])
        rendered = "".join(f"<|{m['role']}|>{text_of(m['content'])}\n" for m in messages)
        return [min(ord(c), 255) for c in rendered + "<|assistant|>"]

    def _reply_tokens(self, max_tokens: int) -> list[str]:
        think = self._last_thinking if self.think is None else self.think
        script = self.scripts.pop(0) if self.scripts else self.script
        text = (THINK_SCRIPT if think else "") + script
        toks = split_tokens(text)
        if self.repeat_to:
            body = split_tokens(script)
            while len(toks) < self.repeat_to:
                toks.extend(body)
            toks = toks[: self.repeat_to]
        return toks[:max_tokens]

    def decoder(self, *, max_streams: int, state: object = None,
                carryover: object = None) -> ScriptedDecoder:
        """The decoder the engine's scheduler runs requests through (the engine-owned decode
        state, ``state`` or ``carryover``, is ignored: the script decides the depth)."""
        return ScriptedDecoder(self._start, max_streams=max_streams, pace=self._pace)

    def generate(self, prompt_ids: list[int], *, max_tokens: int = 256, depth: int | str = 0,
                 sampling: SamplingParams | None = None, seed: int | None = None,
                 cancel: threading.Event | None = None,
                 stop_strings: tuple[str, ...] | list[str] = (),
                 constraint: object = None) -> Iterator[Event]:
        """One request's events, through a one-stream ``decoder``."""
        dec = self.decoder(max_streams=1)
        dec.add(prompt_ids, max_tokens=max_tokens, depth=depth, sampling=sampling, seed=seed,
                cancel=cancel, stop_strings=tuple(stop_strings), constraint=constraint)
        while dec.busy:
            for part in (dec.admit_step, dec.cycle_step):  # the first event before the cycle
                for _stream, ev in part():
                    yield ev

    def _start(self, req: StreamRequest) -> Iterator[Event]:
        """A stream's events (``ScriptedDecoder``'s ``start``): recorded in ``calls`` now,
        the reply cut from the script as it stands now."""
        self.calls.append({"prompt_ids": list(req.prompt_ids), "max_tokens": req.max_tokens,
                           "depth": req.depth, "sampling": req.sampling, "seed": req.seed})
        toks = self._reply_tokens(req.max_tokens)
        rng = random.Random(req.seed if req.seed is not None else 1234)
        k = self.info.max_depth if req.depth == "auto" else int(req.depth)
        return self._stream(req, toks, k, rng)

    def _stream(self, req: StreamRequest, toks: list[str], k: int,
                rng: random.Random) -> Iterator[Event]:
        if self.prefill_seconds:
            time.sleep(self.prefill_seconds)
        n = len(req.prompt_ids)
        yield Event(token_ids=(), prefill=PrefillStats(n, 0, self.prefill_seconds))
        yield from self._cycles(toks, k, rng, req.cancel, n, req.max_tokens)

    def _per_token(self) -> float:
        return 1.0 / self.tokens_per_second if self.tokens_per_second > 0 else 0.0

    def _pace(self, events: list[tuple[ScriptedStream, Event]]) -> None:
        """A cycle's time: its longest row's tokens at ``tokens_per_second``."""
        longest = max((len(ev.token_ids) for _st, ev in events), default=0)
        if longest and self._per_token():
            time.sleep(self._per_token() * longest)

    def _cycles(self, toks: list[str], k: int, rng: random.Random,
                cancel: threading.Event | None, ctx: int, max_tokens: int) -> Iterator[Event]:
        """The cycles of one reply (their time is spent by ``_pace``, once per batched cycle)."""
        pos = 0
        index = 0
        while pos < len(toks):
            if cancel is not None and cancel.is_set():
                yield Event(token_ids=(), finish_reason="cancelled")
                return
            accepted = 0
            while accepted < k and rng.random() < self.acceptance:
                accepted += 1
            n = min(accepted + 1, len(toks) - pos)
            if self.fail_after is not None and pos + n > self.fail_after:
                raise self.error or RuntimeError("fake engine failure")
            chunk = toks[pos:pos + n]
            ids = tuple(100 + pos + i for i in range(n))
            flags = tuple(i < accepted for i in range(n))
            pos += n
            stats = CycleStats(
                index=index, depth=k, drafted=tuple(range(k)), accepted=min(accepted, n),
                emitted=ids, from_draft=flags,
                extra_kind="plain" if k == 0 else ("bonus" if accepted == k else "correction"),
                t_total=self._per_token() * n, context_tokens=ctx + pos)
            index += 1
            last = pos >= len(toks)
            reason = None
            if last:
                reason = "length" if pos >= max_tokens else "stop"
            yield Event(token_ids=ids, text="".join(chunk), stats=stats, finish_reason=reason)
        if not toks:
            yield Event(token_ids=(), finish_reason="stop")


def make_fake_loader(model: FakeModel | None = None, *, delay: float = 0.0,
                     require_exists: bool = False) -> Callable[[str], FakeModel]:
    """A loader with ``engine.load``'s signature that returns ``model`` (or a new FakeModel)."""

    def load(path: str) -> FakeModel:
        if require_exists and not Path(path).exists():
            raise ModelLoadError(f"Model folder not found: {path}")
        if delay:
            time.sleep(delay)
        m = model or FakeModel()
        m.info = fake_model_info(str(path), supports_thinking=m.info.supports_thinking,
                                 has_mtp=m.info.has_mtp, max_depth=m.info.max_depth or 3,
                                 vision=bool(getattr(m.info, "vision", False)))
        return m

    return load
