"""Incremental detokenization with stop strings (complete UTF-8 only, no O(n²) re-decode)."""
from __future__ import annotations


class StreamingText:
    """Feed token ids, get text deltas. Holds back text that may be the start of a stop string
    or an incomplete UTF-8 sequence. ``stopped`` turns True once a stop string appears; the
    delta returned then ends right before it."""

    def __init__(self, tokenizer, stop_strings: tuple[str, ...] = (), skip_ids: set[int] | None = None):
        self.tok = tokenizer
        self.stops = tuple(s for s in stop_strings if s)
        self.skip = skip_ids or set()
        self.ids: list[int] = []
        self.prefix_offset = 0   # start of the window re-decoded for context
        self.read_offset = 0     # tokens whose text is final
        self.text = ""           # final text so far (before hold-back)
        self.emitted = 0         # chars of self.text handed out
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def add(self, token_ids: list[int]) -> str:
        for t in token_ids:
            if t not in self.skip:
                self.ids.append(t)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix):]
            # keep a short window of context so BPE merges decode the same way
            self.prefix_offset = max(len(self.ids) - 4, 0)
            self.read_offset = len(self.ids)
        return self._release(final=False)

    def _release(self, *, final: bool) -> str:
        if self.stopped:
            return ""
        for s in self.stops:
            i = self.text.find(s, max(0, self.emitted - len(s)))
            if i != -1:
                self.stopped = True
                out = self.text[self.emitted:i]
                self.emitted = i
                return out
        hold = 0
        if not final:
            for s in self.stops:
                for n in range(min(len(s) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(s[:n]):
                        hold = max(hold, n)
                        break
        end = max(len(self.text) - hold, self.emitted)
        out = self.text[self.emitted:end]
        self.emitted = end
        return out

    def flush(self) -> str:
        """At the end: release what was held back for stop strings (and any tail bytes)."""
        if not self.stopped:
            full = self._decode(self.ids[self.prefix_offset:])
            prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
            if len(full) > len(prefix):
                self.text += full[len(prefix):].rstrip("\ufffd")
                self.read_offset = len(self.ids)
        return self._release(final=True)
