"""A deterministic byte-level BPE trainer.

``tokenizers``' own ``BpeTrainer`` breaks ties between equally frequent symbols and pairs in
Rust hash-map order, which is randomised per process, so two runs on the same text give
different merges. This trainer counts the same pre-tokenised words (Qwen's split regex, NFC,
byte-level alphabet, via ``tokenizers``' own normaliser and pre-tokeniser) and always merges
the most frequent pair, ties broken by the pair's strings -- the same text gives the same
vocabulary and merges in every process.
"""
from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import Iterable


def _words(texts: Iterable[str], normalizer, pre_tokenizer, specials: list[str]) -> Counter:
    split = re.compile("|".join(re.escape(s) for s in specials))
    counts: Counter = Counter()
    for text in texts:
        for chunk in split.split(text):
            if not chunk:
                continue
            norm = normalizer.normalize_str(chunk)
            counts.update(piece for piece, _ in pre_tokenizer.pre_tokenize_str(norm))
    return counts


def _pairs_of(symbols: list[str]):
    return zip(symbols, symbols[1:])


def train_bpe(texts: Iterable[str], *, vocab_size: int, alphabet: list[str],
              specials: list[str], normalizer, pre_tokenizer,
              min_frequency: int = 2) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges): specials first, then the sorted byte alphabet, then merged symbols."""
    counts = _words(texts, normalizer, pre_tokenizer, specials)
    words = sorted(counts)  # a fixed order for everything that follows
    freq = [counts[w] for w in words]
    symbols = [list(w) for w in words]
    vocab: dict[str, int] = {}
    for tok in [*specials, *sorted(set(alphabet))]:
        vocab.setdefault(tok, len(vocab))

    pair_count: Counter = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for i, syms in enumerate(symbols):
        for pair in _pairs_of(syms):
            pair_count[pair] += freq[i]
            where.setdefault(pair, set()).add(i)
    heap = [(-c, pair) for pair, c in pair_count.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while len(vocab) < vocab_size and heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg:
            continue  # stale entry
        if -neg < min_frequency:
            break
        merged = pair[0] + pair[1]
        merges.append(pair)
        vocab.setdefault(merged, len(vocab))
        changed: Counter = Counter()
        for i in sorted(where.pop(pair, ())):
            old = symbols[i]
            new: list[str] = []
            j = 0
            while j < len(old):
                if j + 1 < len(old) and old[j] == pair[0] and old[j + 1] == pair[1]:
                    new.append(merged)
                    j += 2
                else:
                    new.append(old[j])
                    j += 1
            for p in _pairs_of(old):
                changed[p] -= freq[i]
            for p in _pairs_of(new):
                changed[p] += freq[i]
                where.setdefault(p, set()).add(i)
            symbols[i] = new
        for p, delta in sorted(changed.items()):
            if delta:
                pair_count[p] += delta
                if pair_count[p] > 0:
                    heapq.heappush(heap, (-pair_count[p], p))
                else:
                    del pair_count[p]
        pair_count.pop(pair, None)
    return vocab, merges
