"""A scripted model for server tests: the public Model interface (generate, decoder, chat_ids,
info, tokenizer), no weights. ``decoder`` is ``app.fake.decoder.ScriptedDecoder`` over
``generate``, so the scheduler drives it exactly as it drives the engine's ``BatchDecoder``. Each ``generate`` call replies with the next script in ``replies``
(or ``default``), one token per character, a few characters per cycle; a script "FAIL"
raises ``GenerationError``-free RuntimeError mid-reply (an engine failure)."""
from __future__ import annotations

import threading
import time

from engine.types import CycleStats, Event, ModelInfo, PrefillStats


def fake_info() -> ModelInfo:
    return ModelInfo(
        path="/fake/scripted", name="scripted-fake", architecture="Qwen3_5ForCausalLM",
        family="qwen3_5", layout="mlx", num_parameters=1, bytes_on_disk=1, quantization=None,
        has_mtp=True, mtp_layers=1, max_depth=6, context_length=4096, vocab_size=256,
        hidden_size=8, num_layers=1, dtype="float32", eos_token_ids=(0,),
        supports_thinking=True)


class ScriptedModel:
    def __init__(self, *, default: str = "Hello from the fake.", seconds_per_cycle: float = 0.0):
        self.info = fake_info()
        self.tokenizer = None
        self.default = default
        self.replies: list[str] = []
        self.prompts: list[str] = []      # every rendered chat transcript, in order
        self.calls: list[dict] = []
        self.seconds_per_cycle = seconds_per_cycle
        self.started = threading.Event()

    def chat_ids(self, messages, *, enable_thinking=None, add_generation_prompt=True):
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"
        self.prompts.append(text)
        return [min(ord(c), 255) for c in text]

    def decoder(self, *, max_streams: int):
        from app.fake.decoder import ScriptedDecoder

        return ScriptedDecoder(lambda r: self.generate(
            list(r.prompt_ids), max_tokens=r.max_tokens, depth=r.depth, sampling=r.sampling,
            seed=r.seed, cancel=r.cancel, stop_strings=r.stop_strings), max_streams=max_streams)

    def generate(self, prompt_ids, *, max_tokens=256, depth=0, sampling=None, seed=None,
                 cancel=None, stop_strings=()):
        self.calls.append({"depth": depth, "max_tokens": max_tokens, "sampling": sampling,
                           "stop": tuple(stop_strings)})
        script = self.replies.pop(0) if self.replies else self.default
        self.started.set()
        if script == "FAIL":
            raise RuntimeError("scripted engine failure")
        chars = list(script)[:max_tokens]
        yield Event(token_ids=(ord(chars[0]),), text=chars[0],
                    prefill=PrefillStats(len(prompt_ids), 0, 0.001),
                    finish_reason="length" if max_tokens == 1 else None)
        pos, index = 1, 0
        while pos < len(chars):
            if cancel is not None and cancel.is_set():
                yield Event(token_ids=(), finish_reason="cancelled")
                return
            time.sleep(self.seconds_per_cycle)
            chunk = chars[pos:pos + 3]
            pos += len(chunk)
            k = 0 if depth == 0 else 2
            stats = CycleStats(index=index, depth=k, drafted=tuple(range(k)),
                               accepted=min(k, len(chunk) - 1), emitted=tuple(map(ord, chunk)),
                               from_draft=(True,) * min(k, len(chunk) - 1) + (False,),
                               extra_kind="plain" if k == 0 else "correction",
                               t_total=0.001)
            index += 1
            done = pos >= len(chars)
            finish = None if not done else ("length" if len(script) > max_tokens else "stop")
            yield Event(token_ids=tuple(map(ord, chunk)), text="".join(chunk), stats=stats,
                        finish_reason=finish)
