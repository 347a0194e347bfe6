"""The demo model's training run: corpus -> tokenizer -> joint training -> MTP distillation.

Phase 1 (joint) trains trunk and head together: loss = CE(trunk) + ``mtp_weight`` * CE(MTP step
1 vs the data token x_{t+2}), as DeepSeek-V3 and Qwen do. Phase 2 freezes the trunk and trains
the head alone by distillation: every step s = 1..``depth`` of every draft chain (teacher-forced
with the data tokens, step s >= 2 fed the head's own output hidden after ``mtp.norm``) is pulled
towards the trunk's own next-token distribution at the position it drafts for. Greedy
acceptance is measured on held-out prompts after each phase and the better head is kept.
Phase 3 (refine, ``refine_steps``) distils that head further with a fresh optimizer and
learning-rate schedule on windows of its own; it depends only on the exported phase-2 folder,
so ``refine_demo`` can also run it alone on an existing folder (``engine.training.refine``).

Deterministic given the seed on one machine (single process, seeded generators, deterministic
torch algorithms). Progress goes to the ``report`` callback (the CLI prints it).
"""
from __future__ import annotations

import copy
import json
import logging
import math
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.training import acceptance, corpus, readme, tokenizer, tool_chats
from engine.training.export import export_model
from engine.training.model import (FULL_SIZE, TINY_SIZE, DemoModel, ModelSize, build_model,
                                   count_parameters)

log = logging.getLogger(__name__)
Report = Callable[[dict], None]


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the trained model (with the Python/torch versions)."""

    size: ModelSize = FULL_SIZE
    seed: int = 0
    vocab_size: int = 4096
    seq_len: int = 256
    batch_size: int = 8
    joint_steps: int = 2289
    mtp_steps: int = 378
    lr: float = 3e-3
    mtp_lr: float = 1e-3
    warmup: int = 30
    weight_decay: float = 0.05
    mtp_weight: float = 0.3
    depth: int = 3
    depth_weights: tuple[float, ...] = (1.0, 0.6, 0.4)
    corpus_variants: int = 6
    corpus_limit: int | None = None
    tool_share: float = 0.3  # of the joint phase's windows, from the tool chats (0: none)
    # of the MTP phase's windows, from its own generator (None: the joint phase's windows go on)
    mtp_tool_share: float | None = None
    refine_steps: int = 333  # phase 3: more distillation of the kept head (0: none)
    refine_tool_share: float = 0.3  # of phase 3's windows, from the tool chats
    tool_heldout: int = tool_chats.TOOL_HELDOUT
    tool_synthetic: int = 3000  # made-up names in the tool chats (tool_chats.synthetic_items)
    eval_prompts: int = 32
    eval_max_new: int = 64
    final_eval_prompts: int = 64
    final_eval_max_new: int = 96
    threads: int = 1
    log_every: int = 10


TINY = TrainConfig(size=TINY_SIZE, vocab_size=1024, seq_len=64, batch_size=4, joint_steps=12,
                   mtp_steps=6, refine_steps=3, warmup=2, corpus_variants=1, corpus_limit=400,
                   tool_heldout=4, tool_synthetic=20, eval_prompts=3, eval_max_new=12,
                   final_eval_prompts=3, final_eval_max_new=12, log_every=2)


def config_for(*, tiny: bool, steps: int | None, seed: int) -> TrainConfig:
    """The shipped (or tiny) configuration; ``steps`` scales the three phases keeping their
    ratio (the MTP phase gets one step from 2 steps on, the refine phase from 3)."""
    cfg = TINY if tiny else TrainConfig()
    cfg = replace(cfg, seed=seed)
    if steps is not None:
        total = total_steps(cfg)
        mtp = max(1, round(steps * cfg.mtp_steps / total)) if steps > 1 else 0
        refine = max(1, round(steps * cfg.refine_steps / total)) if steps > 2 else 0
        cfg = replace(cfg, joint_steps=max(1, steps - mtp - refine), mtp_steps=mtp,
                      refine_steps=refine if cfg.refine_steps else 0)
    return cfg


def total_steps(cfg: TrainConfig) -> int:
    return cfg.joint_steps + cfg.mtp_steps + cfg.refine_steps


def _lr_at(step: int, total: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


class Batches:
    """Random windows of the token streams and their loss masks, from a seeded generator: a
    ``tool_share`` of the rows from the tool chats' stream (when it has any), the others from
    the question/answer stream, whatever their sizes."""

    def __init__(self, streams: tuple[torch.Tensor, torch.Tensor],
                 tools: tuple[torch.Tensor, torch.Tensor] | None, seq_len: int, batch: int,
                 seed: int, tool_share: float = 0.0):
        self.streams = [streams] + ([tools] if tools is not None and len(tools[0]) else [])
        self.seq_len, self.batch = seq_len, batch
        self.share = tool_share if len(self.streams) > 1 else 0.0
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.share:  # one stream: the same windows as before the tool chats
            stream, mask = self.streams[0]
            starts = torch.randint(0, len(stream) - self.seq_len, (self.batch,),
                                   generator=self.gen).tolist()
            return (torch.stack([stream[s:s + self.seq_len] for s in starts]),
                    torch.stack([mask[s:s + self.seq_len] for s in starts]))
        rows = []
        which = (torch.rand(self.batch, generator=self.gen) < self.share).tolist()
        for use_tools in which:
            stream, mask = self.streams[1 if use_tools else 0]
            hi = max(1, len(stream) - self.seq_len)
            s = int(torch.randint(0, hi, (1,), generator=self.gen))
            rows.append((stream[s:s + self.seq_len], mask[s:s + self.seq_len]))
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


def assistant_mask(ids: list[int], tok) -> list[float]:
    """1.0 for tokens of assistant turns (the role line excluded, ``<|im_end|>`` included)."""
    start, end = tok.token_to_id(tokenizer.IM_START), tok.token_to_id(tokenizer.IM_END)
    mask = [0.0] * len(ids)
    inside = False
    i = 0
    while i < len(ids):
        if ids[i] == start:
            j = i + 1
            while j < len(ids) and "\n" not in tok.decode(ids[i + 1:j + 1]):
                j += 1
            inside = tok.decode(ids[i + 1:j + 1]).strip() == "assistant"
            i = j + 1
            continue
        if inside:
            mask[i] = 1.0
            inside = ids[i] != end
        i += 1
    return mask


def _masked_ce(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy averaged over the positions where ``mask`` is 1 (hard or soft targets)."""
    vocab = logits.shape[-1]
    soft = target.dim() == logits.dim()
    tgt = target.reshape(-1, vocab) if soft else target.reshape(-1)
    per = F.cross_entropy(logits.reshape(-1, vocab), tgt, reduction="none")
    m = mask.reshape(-1)
    return (per * m).sum() / m.sum().clamp_min(1.0)


class Progress:
    def __init__(self, report: Report, total_steps: int, tokens_per_step: int):
        self.report, self.total, self.tps = report, total_steps, tokens_per_step
        self.t0 = time.monotonic()
        self.done = 0

    def step(self, phase: str, step: int, **values: float) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.t0
        rate = self.done / elapsed
        self.report({"event": "step", "phase": phase, "step": step, **values,
                     "tokens_per_s": round(rate * self.tps, 1), "elapsed_s": round(elapsed, 1),
                     "eta_s": round((self.total - self.done) / rate, 1)})


def _joint_phase(model: DemoModel, cfg: TrainConfig, batches: Batches, prog: Progress) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95))
    model.train()
    last = {}
    for step in range(cfg.joint_steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg.joint_steps, cfg.lr, cfg.warmup)
        ids, mask = batches.next()
        hidden, logits = model.trunk_forward(ids)
        loss = _masked_ce(logits[:, :-1], ids[:, 1:], mask[:, 1:])
        mtp_logits = model.mtp_chains(hidden, ids, 1)[0]
        mtp_loss = _masked_ce(mtp_logits[:, :-1], ids[:, 2:], mask[:, 2:])
        opt.zero_grad(set_to_none=True)
        (loss + cfg.mtp_weight * mtp_loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        last = {"loss": round(loss.item(), 4), "mtp_loss": round(mtp_loss.item(), 4)}
        if step % cfg.log_every == 0 or step == cfg.joint_steps - 1:
            prog.step("joint", step, **last)
        else:
            prog.done += 1
    return last


def _distill_loss(model: DemoModel, batch: tuple[torch.Tensor, torch.Tensor],
                  cfg: TrainConfig) -> list[torch.Tensor]:
    ids, mask = batch
    with torch.no_grad():
        hidden, logits = model.trunk_forward(ids)
        target = logits.softmax(-1)
    chains = model.mtp_chains(hidden, ids, cfg.depth)
    mask = F.pad(mask, (0, 1))  # the last row's data token lies past the window
    losses = []
    for s, chain in enumerate(chains, start=1):
        # Row t of step s drafts x_{t+s+1}: the trunk's distribution at position t+s.
        n = chain.shape[1]
        losses.append(_masked_ce(chain, target[:, s:s + n], mask[:, s + 1:s + 1 + n]))
    return losses


def _mtp_batches(cfg: TrainConfig, joint: Batches, base, tool) -> Batches:
    """The MTP phase's windows: the joint phase's stream goes on (the shipped demo), or with
    ``mtp_tool_share`` set, a stream of its own with that share of tool-chat windows (0 lets
    the head distil the question/answer chats only, where its acceptance is measured)."""
    if cfg.mtp_tool_share is None:
        return joint
    return Batches(base, tool, cfg.seq_len, cfg.batch_size, cfg.seed + 31, cfg.mtp_tool_share)


def refine_batches(cfg: TrainConfig, base, tool) -> Batches:
    """Phase 3's windows: a generator of their own, ``refine_tool_share`` from the tool chats."""
    return Batches(base, tool, cfg.seq_len, cfg.batch_size, cfg.seed + 53,
                   cfg.refine_tool_share)


def refine_phase(model: DemoModel, cfg: TrainConfig, batches: Batches, prog: Progress) -> dict:
    """Phase 3: ``refine_steps`` more distillation steps on the kept head, with a fresh
    optimizer and learning-rate schedule."""
    return mtp_phase(model, replace(cfg, mtp_steps=cfg.refine_steps), batches, prog, "refine")


def mtp_phase(model: DemoModel, cfg: TrainConfig, batches: Batches, prog: Progress,
              name: str = "mtp") -> dict:
    for p in model.trunk.parameters():
        p.requires_grad_(False)
    params = list(model.mtp.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.mtp_lr, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    last = {}
    for step in range(cfg.mtp_steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg.mtp_steps, cfg.mtp_lr, min(cfg.warmup, 10))
        losses = _distill_loss(model, batches.next(), cfg)
        total = sum(w * l for w, l in zip(cfg.depth_weights, losses))
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        last = {f"mtp_kl_step{s}": round(l.item(), 4) for s, l in enumerate(losses, start=1)}
        if step % cfg.log_every == 0 or step == cfg.mtp_steps - 1:
            prog.step(name, step, **last)
        else:
            prog.done += 1
    for p in model.trunk.parameters():
        p.requires_grad_(True)
    return last


def _score(acc: dict) -> float:
    """Expected tokens per cycle at the deepest measured depth (the selection criterion)."""
    tpc = acc["tokens_per_cycle"]
    return float(tpc[max(tpc)] or 0.0)


def prompt_ids(tok, prompts: list[str]) -> list[list[int]]:
    return [tok.encode(tokenizer.render_chat([{"role": "user", "content": p}],
                                             add_generation_prompt=True,
                                             enable_thinking=False)).ids for p in prompts]


def answer_quality(tok, outputs: list[list[int]], heldout: list[dict]) -> dict:
    """How many greedy answers to held-out phrasings name the right object and contain its
    docstring's first sentence (the facts a correct answer has)."""
    named = correct = 0
    pairs = list(zip(outputs, heldout))
    for ids, item in pairs:
        text = tok.decode(ids)
        named += item["qualname"] in text
        correct += item["qualname"] in text and item["first_sentence"] in text
    n = max(1, len(pairs))
    return {"answers": len(pairs), "names_object": round(named / n, 3),
            "correct": round(correct / n, 3)}


def token_stream(tok, ids: dict, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    stream: list[int] = []
    mask: list[float] = []
    for enc in tok.encode_batch(texts):
        stream += enc.ids + [ids[tokenizer.ENDOFTEXT]]
        mask += assistant_mask(enc.ids, tok) + [0.0]
    return torch.tensor(stream, dtype=torch.long), torch.tensor(mask)


def tool_chat_set(cfg: TrainConfig) -> tool_chats.ToolChats:
    """The tool chats and held-out tool questions ``cfg`` trains on."""
    return tool_chats.build_tool_chats(
        tool_chats.collect_tool_items(limit=cfg.corpus_limit), seed=cfg.seed,
        heldout=cfg.tool_heldout, synthetic=cfg.tool_synthetic)


def prepare(cfg: TrainConfig, out_dir: Path, report: Report):
    """Corpus and tool chats, tokenizer (saved into ``out_dir``), token streams and held-out
    prompts (``heldout*.json``)."""
    data = corpus.build_corpus(seed=cfg.seed, variants=cfg.corpus_variants,
                               limit_items=cfg.corpus_limit)
    texts = [tokenizer.render_chat(chat) for chat in data.train_chats]
    tools = tool_chat_set(cfg) if cfg.tool_share else tool_chats.ToolChats([], [])
    tool_texts = [tokenizer.render_chat(chat) for chat in tools.chats]
    tok = tokenizer.train_tokenizer(texts + tool_texts, vocab_size=cfg.vocab_size)
    tokenizer.save_tokenizer(tok, out_dir, model_max_length=cfg.size.max_position_embeddings)
    ids = tokenizer.token_ids(tok)
    base, tool = token_stream(tok, ids, texts), token_stream(tok, ids, tool_texts)
    for name, rows in (("heldout_prompts.json", data.heldout_prompts),
                       ("heldout.json", data.heldout), ("heldout_tools.json", tools.heldout)):
        (out_dir / name).write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n",
                                    encoding="utf-8")
    report({"event": "data", "chats": len(data.train_chats), "items": data.n_items,
            "heldout_prompts": len(data.heldout), "tokens": len(base[0]),
            "tool_chats": len(tools.chats), "tool_tokens": len(tool[0]),
            "tokenizer_vocab": tok.get_vocab_size()})
    return tok, ids, base, tool, data, tools


def refine(model: DemoModel, cfg: TrainConfig, streams: tuple, eval_set: list[list[int]],
           eos: set[int], prog: Progress, report: Report) -> tuple[dict, dict | None]:
    """Phase 3 (when ``cfg.refine_steps``) and the acceptance after it on ``eval_set``."""
    if not cfg.refine_steps:
        return {}, None
    losses = refine_phase(model, cfg, refine_batches(cfg, *streams), prog)
    acc = acceptance.measure(model, eval_set, eos=eos, depth=cfg.depth, max_new=cfg.eval_max_new)
    acc.pop("outputs", None)
    report({"event": "eval", "after": "refine", **acc})
    return losses, acc


def final_evals(model: DemoModel, cfg: TrainConfig, tok, prompts: list[list[int]],
                heldout: list[dict], tool_heldout: list[dict], eos: set[int],
                report: Report) -> dict:
    """The shipped head's acceptance and answer quality, then its tool calls (summary keys)."""
    final = acceptance.measure(model, prompts[:cfg.final_eval_prompts], eos=eos,
                               depth=cfg.depth, max_new=cfg.final_eval_max_new)
    final["quality"] = answer_quality(tok, final.pop("outputs"), heldout)
    report({"event": "eval", "after": "final", **final})
    tools_eval = tool_chats.evaluate(model, tok, tool_heldout, eos=eos, depth=cfg.depth)
    report({"event": "eval", "after": "tools", **tools_eval})
    return {"acceptance_final": final, "tools_final": tools_eval}


def write_summary(out_dir: Path, summary: dict, report: Report) -> None:
    (out_dir / "training.json").write_text(json.dumps(summary, indent=1) + "\n",
                                           encoding="utf-8")
    readme.write_readme(out_dir, summary, out=str(out_dir))
    report({"event": "done", "seconds": summary["train_seconds"], "out": str(out_dir)})


def train_demo(out_dir: Path, cfg: TrainConfig, report: Report) -> dict:
    """Train, measure and export the demo model into ``out_dir``; returns a summary."""
    t0 = time.monotonic()
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok, ids, base, tool, data, tools = prepare(cfg, out_dir, report)
    vocab = 64 * math.ceil(tok.get_vocab_size() / 64)
    model = build_model(cfg.size, vocab_size=vocab, eos_token_id=ids[tokenizer.IM_END],
                        pad_token_id=ids[tokenizer.ENDOFTEXT], seed=cfg.seed)
    params = count_parameters(model)
    report({"event": "model", "vocab_size": vocab, **params})
    batches = Batches(base, tool, cfg.seq_len, cfg.batch_size, cfg.seed + 17, cfg.tool_share)
    prog = Progress(report, total_steps(cfg), cfg.batch_size * cfg.seq_len)
    eos = {ids[tokenizer.IM_END], ids[tokenizer.ENDOFTEXT]}
    prompts = prompt_ids(tok, data.heldout_prompts)

    joint = _joint_phase(model, cfg, batches, prog)
    export_model(model, cfg.size, out_dir, ids=ids)  # a usable interim model
    eval_set = prompts[:cfg.eval_prompts]
    acc_joint = acceptance.measure(model, eval_set, eos=eos, depth=cfg.depth,
                                   max_new=cfg.eval_max_new)
    acc_joint["quality"] = answer_quality(tok, acc_joint.pop("outputs"), data.heldout)
    report({"event": "eval", "after": "joint", **acc_joint})
    joint_head = copy.deepcopy(model.mtp.state_dict())
    mtp_batches = _mtp_batches(cfg, batches, base, tool)
    distill = mtp_phase(model, cfg, mtp_batches, prog) if cfg.mtp_steps else {}
    acc_mtp = acceptance.measure(model, eval_set, eos=eos, depth=cfg.depth,
                                 max_new=cfg.eval_max_new) if cfg.mtp_steps else acc_joint
    acc_mtp.pop("outputs", None)
    report({"event": "eval", "after": "mtp", **acc_mtp})
    chosen = "mtp" if _score(acc_mtp) >= _score(acc_joint) else "joint"
    if chosen == "joint":
        model.mtp.load_state_dict(joint_head)
    refined, acc_refine = refine(model, cfg, (base, tool), eval_set, eos, prog, report)
    export_model(model, cfg.size, out_dir, ids=ids)
    summary = {
        "config": {**asdict(cfg), "size": cfg.size.as_dict()},
        "default_steps": total_steps(TrainConfig()),
        "parameters": params, "vocab_size": vocab, "token_ids": ids,
        "stream_tokens": len(base[0]), "tool_tokens": len(tool[0]),
        "tool_chats": len(tools.chats), "items": data.n_items,
        "heldout_prompts": len(data.heldout),
        "joint_final": joint, "mtp_final": distill,
        "acceptance_after_joint": acc_joint, "acceptance_after_mtp": acc_mtp,
        "chosen_head": chosen, "refine_final": refined, "acceptance_after_refine": acc_refine,
        **final_evals(model, cfg, tok, prompts, data.heldout, tools.heldout, eos, report),
        "train_seconds": round(time.monotonic() - t0, 1),
        "torch_version": torch.__version__,
        "python": platform.python_version(),
    }
    write_summary(out_dir, summary, report)
    return summary
