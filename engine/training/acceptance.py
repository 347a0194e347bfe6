"""Greedy acceptance of the torch MTP head against its own trunk (temperature 0).

For each prompt the trunk decodes greedily (transformers' cached path). Over that sequence the
head drafts, for every chain start t in the generated region, the chain d_1..d_k from the pair
(h_t, x_{t+1}) -- step s >= 2 fed the previous draft -- and d_s is accepted when it equals the
trunk's own token x_{t+s+1}. Reported:

- ``acceptance[s]``: P(d_s accepted | d_1..d_{s-1} accepted), over all chain starts;
- ``tokens_per_cycle[k]``: tokens emitted per decode cycle when drafting k tokens per cycle
  (accepted drafts + one correction/bonus), simulated cycle by cycle from the first token;
- ``outputs``: the generated token ids per prompt (for answer-quality checks).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from engine.training.model import DemoModel


@torch.no_grad()
def greedy_generate(model: DemoModel, prompt: list[int], *, max_new: int,
                    eos: set[int]) -> list[int]:
    """Prompt + greedy continuation (stops after an eos token or ``max_new`` tokens)."""
    cache = DynamicCache(config=model.config)
    out = model.trunk(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
    seq = list(prompt)
    for _ in range(max_new):
        nxt = int(out.logits[0, -1].argmax())
        seq.append(nxt)
        if nxt in eos:
            break
        out = model.trunk(input_ids=torch.tensor([[nxt]]), cache=out.cache, use_cache=True)
    return seq


@torch.no_grad()
def draft_matches(model: DemoModel, seq: list[int], prompt_len: int,
                  depth: int) -> list[list[bool]]:
    """For each chain start t (prompt_len-1 <= t <= len-3): d_s == x_{t+s+1}, s = 1.. while in range."""
    ids = torch.tensor([seq])
    hidden, _ = model.trunk_forward(ids)
    chains = model.mtp_chains(hidden, ids, depth, feed_drafts=True)
    drafts = [c[0].argmax(-1).tolist() for c in chains]
    rows: list[list[bool]] = []
    for t in range(prompt_len - 1, len(seq) - 2):
        row = []
        for s in range(1, depth + 1):
            target = t + s + 1
            if target >= len(seq) or t >= len(drafts[s - 1]):
                break
            row.append(drafts[s - 1][t] == seq[target])
        rows.append(row)
    return rows


def _conditional(rows: list[list[bool]], depth: int) -> tuple[list[int], list[int]]:
    tried, ok = [0] * depth, [0] * depth
    for row in rows:
        for s, hit in enumerate(row):
            tried[s] += 1
            ok[s] += hit
            if not hit:
                break
    return tried, ok


def _cycles(rows: list[list[bool]], k: int, n_generated: int) -> tuple[int, int]:
    """(cycles, tokens) for depth-k decoding of a sequence whose first generated token is free."""
    pos, cycles, tokens = 0, 0, 0  # pos indexes rows: chain start t = prompt_len - 1 + pos
    remaining = n_generated - 1
    while remaining > 0 and pos < len(rows):
        accepted = 0
        for hit in rows[pos][:k]:
            if not hit:
                break
            accepted += 1
        emitted = min(accepted + 1, remaining)
        cycles += 1
        tokens += emitted
        remaining -= emitted
        pos += emitted
    return cycles, tokens


def measure(model: DemoModel, prompts: list[list[int]], *, eos: set[int], depth: int = 3,
            max_new: int = 96) -> dict:
    """Acceptance by position and tokens per cycle over ``prompts`` (see module docstring)."""
    model.eval()
    tried, ok = [0] * depth, [0] * depth
    cyc = {k: [0, 0] for k in range(1, depth + 1)}
    n_tokens = 0
    outputs: list[list[int]] = []
    for prompt in prompts:
        seq = greedy_generate(model, prompt, max_new=max_new, eos=eos)
        outputs.append(seq[len(prompt):])
        n_gen = len(seq) - len(prompt)
        n_tokens += n_gen
        rows = draft_matches(model, seq, len(prompt), depth)
        t_, o_ = _conditional(rows, depth)
        tried = [a + b for a, b in zip(tried, t_)]
        ok = [a + b for a, b in zip(ok, o_)]
        for k in cyc:
            c, t = _cycles(rows, k, n_gen)
            cyc[k][0] += c
            cyc[k][1] += t
    return {
        "prompts": len(prompts),
        "generated_tokens": n_tokens,
        "acceptance": [round(o / t, 4) if t else None for o, t in zip(ok, tried)],
        "drafts_tried": tried,
        "tokens_per_cycle": {k: round(t / c, 3) if c else None for k, (c, t) in cyc.items()},
        "outputs": outputs,
    }
