"""Split a Qwen reply's streamed text into reasoning (``<think>…</think>``) and content.

Contract: ``ThinkSplitter(opened=...)`` where ``opened`` says the prompt itself already opened
a ``<think>`` block (Qwen3.5's template does with thinking on). ``feed(text)`` returns
``[(channel, text), ...]`` with channel ``"reasoning"`` or ``"content"``; ``flush()`` returns
what is still held back. Tag text never reaches either channel; text that may be the start of
a tag is held back until decided. Only a think block at the very start of the reply counts
(leading whitespace aside); later ``<think>`` text is content. The newlines the template puts
around the block (``<think>\\n``, ``\\n</think>\\n\\n``) are dropped.
"""
from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def _partial_suffix(buf: str, tag: str) -> int:
    for n in range(min(len(buf), len(tag) - 1), 0, -1):
        if tag.startswith(buf[-n:]):
            return n
    return 0


class ThinkSplitter:
    def __init__(self, *, opened: bool = False) -> None:
        self.state = "reasoning" if opened else "start"
        self._buf = ""
        self._lstrip = True  # drop leading newlines of the channel just entered

    def feed(self, text: str) -> list[tuple[str, str]]:
        self._buf += text
        out: list[tuple[str, str]] = []
        while self._step(out):
            pass
        return [(c, t) for c, t in out if t]

    def flush(self) -> list[tuple[str, str]]:
        text, self._buf = self._buf, ""
        if self.state == "start":
            self.state = "content"
        if self.state == "reasoning":
            text = text.rstrip("\n")
        return self._emit(self.state, text)

    def _emit(self, channel: str, text: str) -> list[tuple[str, str]]:
        if self._lstrip:
            text = text.lstrip("\n")
            if text:
                self._lstrip = False
        return [(channel, text)] if text else []

    def _step(self, out: list[tuple[str, str]]) -> bool:
        if self.state == "start":
            head = self._buf.lstrip()
            if head.startswith(OPEN):
                self.state, self._buf, self._lstrip = "reasoning", head[len(OPEN):], True
                return True
            if OPEN.startswith(head):
                return False  # undecided (empty or a prefix of <think>)
            self.state = "content"
            return True
        if self.state == "reasoning":
            i = self._buf.find(CLOSE)
            if i >= 0:
                out.extend(self._emit("reasoning", self._buf[:i].rstrip("\n")))
                self.state, self._buf, self._lstrip = "content", self._buf[i + len(CLOSE):], True
                return True
            # Hold a possible partial tag and trailing newlines (they may precede </think>).
            keep = _partial_suffix(self._buf, CLOSE)
            body = self._buf[:len(self._buf) - keep]
            cut = len(body.rstrip("\n"))
            out.extend(self._emit("reasoning", self._buf[:cut]))
            self._buf = self._buf[cut:]
            return False
        out.extend(self._emit("content", self._buf))
        self._buf = ""
        return False
