"""The model folder's README.md, written from the training summary (numbers are measured)."""
from __future__ import annotations

from pathlib import Path

from engine.training.corpus import MODULES
from engine.training.tool_chats import MAX_RESULT, TOOL_MODULES


def _acc_rows(acc: dict) -> str:
    cells = " | ".join("-" if a is None else f"{a:.3f}" for a in acc["acceptance"])
    tpc = " | ".join("-" if v is None else f"{v:.2f}" for v in acc["tokens_per_cycle"].values())
    return f"{cells} | {tpc}"


def _losses(values: dict) -> str:
    return ", ".join(f"{v:.3f}" for v in values.values()) or "-"


def _command(cfg: dict, out: str, default_steps: int | None) -> str:
    cmd = f"python -m engine train-demo --out {out}"
    steps = cfg["joint_steps"] + cfg["mtp_steps"] + cfg.get("refine_steps", 0)
    if default_steps is not None and steps != default_steps:
        cmd += f" --steps {steps}"
    if cfg["seed"]:
        cmd += f" --seed {cfg['seed']}"
    if cfg.get("mtp_tool_share") is not None:
        cmd += f" --mtp-tool-share {cfg['mtp_tool_share']}"
    if cfg.get("refine_steps") and cfg.get("refine_tool_share") != 0.3:
        cmd += f" --refine-tool-share {cfg['refine_tool_share']}"
    if cfg["threads"] != 1:
        cmd += f" --threads {cfg['threads']}"
    return cmd


def _training_commands(summary: dict, out: str) -> str:
    """The command that reproduces the folder; and, when phase 3 ran on its own, the two
    commands that made it."""
    cfg = summary["config"]
    one = _command(cfg, out, summary.get("default_steps"))
    apart = summary.get("refined_separately")
    if not apart:
        return f"```\n{one}\n```\n"
    first = _command({**cfg, "refine_steps": 0}, "PHASE2", None) + " --refine-steps 0"
    second = (f"python -m engine train-demo --refine PHASE2 --out {out} "
              f"--refine-steps {cfg['refine_steps']}")
    if cfg["refine_tool_share"] != 0.3:
        second += f" --refine-tool-share {cfg['refine_tool_share']}"
    return f"""```
{one}
```

These weights were made in two runs of the code that one command chains: phases 1 and 2
({apart['phases_1_2_seconds'] / 60:.0f} minutes), then phase 3 alone on their folder, on
another machine ({apart['seconds'] / 60:.0f} minutes). Phase 3 alone writes the same bytes as
the one command on the machine that ran phases 1 and 2 (a test checks it); since training is
deterministic per machine, the one command run elsewhere gives close but not equal weights.

```
{first}
{second}
```
"""


def _refine_phase(cfg: dict, summary: dict) -> str:
    if not cfg.get("refine_steps"):
        return ""
    steps = cfg["refine_steps"]
    return f"""3. Refine phase, {steps} steps: the kept head distilled as in phase 2, with a
   fresh optimizer and learning-rate schedule (lr {cfg['mtp_lr']}, cosine) on windows of its
   own ({100 * cfg['refine_tool_share']:.0f}% from the tool chats). Final soft cross-entropy
   by step: {_losses(summary.get('refine_final') or {{}})}.
"""


def _refine_row(summary: dict) -> str:
    acc = summary.get("acceptance_after_refine")
    return f"| after refine phase ({acc['prompts']} prompts) | {_acc_rows(acc)} |\n" if acc else ""


def _tool_acceptance(tools: dict) -> str:
    if not tools.get("acceptance"):
        return ""
    accs = " / ".join("-" if a is None else f"{a:.3f}" for a in tools["acceptance"])
    tpc = tools["tokens_per_cycle"]
    return (f" The MTP head's greedy acceptance on those answers, by position: {accs};"
            f" {tpc[max(tpc)]} tokens a cycle at depth {max(tpc)}.")


def _tools_section(summary: dict) -> str:
    tools = summary.get("tools_final")
    if not tools:
        return ""
    examples = "\n".join(
        f"- *{e['prompt']}* -> `{' '.join(e['call'].split())[:120]}`"
        for e in tools.get("examples", []))
    return f"""
## Tool calls (torch, temperature 0)

With the built-in `python_doc` tool offered (the `# Tools` system turn MTP Chat writes for this
template), the model answers a question about a standard-library name by calling
`python_doc(name)`, and after the tool's result by copying the result's signature line and the
docstring's first paragraph. Measured on {tools['prompts']} names of modules it was never
trained on (`heldout_tools.json`; in no training chat): the first reply is exactly the call
`python_doc(name=...)` with the name asked about in {100 * tools['calls']:.0f}%; given the real
result, the answer opens with its signature line in {100 * tools['answers']:.0f}% and equals
the trained answer form in {100 * tools['exact']:.0f}%.{_tool_acceptance(tools)}

{examples}
"""


def render(summary: dict, *, out: str, weights_bytes: int) -> str:
    cfg, size, p = summary["config"], summary["config"]["size"], summary["parameters"]
    ids = summary["token_ids"]
    acc_j, acc_m, final = (summary["acceptance_after_joint"], summary["acceptance_after_mtp"],
                           summary["acceptance_final"])
    quality = final.get("quality", {})
    depth = len(final["acceptance"])
    head = " | ".join(f"a{s}" for s in range(1, depth + 1))
    tpc_head = " | ".join(f"tok/cycle d={k}" for k in range(1, depth + 1))
    sep = "|".join(["---"] * (2 * depth + 1))
    n_layers = size["num_hidden_layers"]
    full = [i for i in range(n_layers) if (i + 1) % size["full_attention_interval"] == 0]
    mtp_share = cfg.get("mtp_tool_share")
    mtp_share = 100 * (cfg.get("tool_share", 0) if mtp_share is None else mtp_share)
    return f"""# mtp-demo-qwen3_5

A miniature of Qwen3.5-0.8B (same architecture, same on-disk layout, same chat tokens), trained
from scratch on this machine so that MTP Chat works offline and its speculative decoding can be
measured against a real, trained MTP head. It answers questions about the Python standard
library in the style of its docstrings; it is a demonstration model, not a useful assistant
(it is small and knows only its corpus; on unseen names it makes things up). With MTP Chat's
built-in `python_doc` tool switched on, it looks names up instead: it calls the tool and
answers from the result.

## Architecture

| | |
|---|---|
| layout | raw Hugging Face, `Qwen3_5ForConditionalGeneration`, `model_type: qwen3_5`, nested `text_config` (`qwen3_5_text`) |
| trunk | {n_layers} layers: Gated DeltaNet, gated full attention at layers {full} (`full_attention_interval: {size['full_attention_interval']}`) |
| hidden / FFN | {size['hidden_size']} / {size['intermediate_size']} (SwiGLU) |
| full attention | {size['num_attention_heads']} query / {size['num_key_value_heads']} KV heads, head_dim {size['head_dim']}, output gate (`q_proj` is 2 x heads x head_dim), q/k RMSNorm, partial rotary {size['partial_rotary_factor']} (theta {size['rope_theta']:.0e}) |
| Gated DeltaNet | {size['linear_num_key_heads']} key heads x {size['linear_key_head_dim']}, {size['linear_num_value_heads']} value heads x {size['linear_value_head_dim']}, conv kernel {size['linear_conv_kernel_dim']} |
| vocabulary | {summary['vocab_size']} (byte-level BPE), tied embeddings |
| MTP head | 1 layer (`mtp_num_hidden_layers: 1`): `mtp.fc` [H, 2H] over [embedding, hidden], `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, one gated full-attention decoder layer, `mtp.norm`, shared LM head |
| parameters | {p['total']:,} ({p['trunk']:,} trunk incl. embeddings + {p['mtp']:,} MTP) |
| weights | `model.safetensors`, float32 ({weights_bytes / 2**20:.1f} MiB); norms stored zero-centred (scale = 1 + w) except the Gated DeltaNet gated norm; conv1d in the raw [C, 1, K] layout; no `lm_head.weight` (tied) |
| context | trained on {cfg['seq_len']}-token windows; `max_position_embeddings` {size['max_position_embeddings']} |

Token ids: `<|endoftext|>` {ids['<|endoftext|>']}, `<|im_start|>` {ids['<|im_start|>']},
`<|im_end|>` {ids['<|im_end|>']} (eos), `<think>` {ids['<think>']}, `</think>` {ids['</think>']}.
`generation_config.json` stops on `[{ids['<|im_end|>']}, {ids['<|endoftext|>']}]`.
The chat template is Qwen3-style (`<|im_start|>role\\n...<|im_end|>\\n`); with
`enable_thinking=False` the generation prompt ends with an empty `<think>\\n\\n</think>\\n\\n`
block, which is how every answer in the corpus starts.

## Corpus and licence

Question/answer chats generated from the docstrings of the Python {summary.get('python', '3.11')}
standard library's most used modules ({len(MODULES)} modules: {', '.join(MODULES)}; read with
`inspect`, nothing downloaded). For each public function and class, the methods of the everyday
classes (`str`, `list`, `dict`, `set`, `pathlib.Path`, `datetime`, `deque`, `Counter`, `re`
patterns and matches) and each module -- {summary['items']:,} documented objects -- questions
such as "What does `json.dumps` do?" are answered with the signature and the first docstring
paragraph(s), 1-3 turns per chat, some with a system prompt ({summary['stream_tokens']:,} tokens).

Tool chats ({summary.get('tool_chats', 0):,} chats, {summary.get('tool_tokens', 0):,} tokens,
{100 * cfg.get('tool_share', 0):.0f}% of the training windows): under the `# Tools` system turn
for `python_doc`, 1-4 rounds of a question about a name (from {len(TOOL_MODULES)} modules the
question/answer corpus does not cover, and a fifth from those it does), the call
`python_doc(name)`, the tool's real result (at most {MAX_RESULT} characters) and an answer
copied from it; half end at the call. `engine/training/tool_chats.py`.

Every object is asked about in 4-8 phrasings, and **one phrasing per object is never trained
on**. `heldout_prompts.json` lists {summary['heldout_prompts']} of those unseen questions (the
benchmarks' in-domain prompts) and `heldout.json` the object and the first docstring sentence a
correct answer contains. The model has to combine what it learnt about the object from other
phrasings with the answer form it learnt from other objects. It knows only these objects: asked
about anything else it answers in the same form with made-up content.

The docstrings are part of CPython: Copyright (c) 2001 Python Software Foundation; All Rights
Reserved, distributed under the PSF License Agreement (version 2), which permits reproduction
and derivative works provided the copyright notice is retained. The weights and tokenizer are
derived works trained by `engine/training/` of this repository and are distributed with MTP
Chat under the project's licence.

## Training

{_training_commands(summary, out)}
Deterministic given the seed and the thread count (single process, torch {summary['torch_version']},
CPU, {cfg['threads']} thread{'s' if cfg['threads'] != 1 else ''}). {summary['train_seconds'] / 60:.1f} minutes in all.

1. Joint phase, {cfg['joint_steps']} steps of {cfg['batch_size']} x {cfg['seq_len']} tokens,
   AdamW lr {cfg['lr']} (cosine): loss = CE(trunk) + {cfg['mtp_weight']} x CE(MTP step 1 vs x_(t+2)),
   both on assistant tokens only (the user's questions are context, not targets).
   Final: loss {summary['joint_final'].get('loss')}, MTP loss {summary['joint_final'].get('mtp_loss')}.
2. MTP phase, {cfg['mtp_steps']} steps, trunk frozen, on windows of the question/answer chats
   ({mtp_share:.0f}% from the tool chats): every step s = 1..{cfg['depth']} of every
   draft chain (step s >= 2 fed the head's own hidden after `mtp.norm` and the next token) is
   distilled towards the trunk's own next-token distribution (soft cross-entropy, weights
   {list(cfg['depth_weights'])}). Final soft cross-entropy by step: {_losses(summary['mtp_final'])}.
{_refine_phase(cfg, summary)}
Greedy acceptance on held-out prompts was measured after phases 1 and 2 and the better head
kept: **{summary['chosen_head']}**{' (then refined)' if cfg.get('refine_steps') else ''}.

## Measured acceptance (torch, float32, temperature 0)

The trunk decodes each held-out prompt greedily (`enable_thinking=False`); for every draft chain
started in the generated text, a_s = P(draft s equals the trunk's own token | drafts 1..s-1
accepted); tokens/cycle simulates decoding with d drafts per cycle (accepted drafts + 1).

| head | {head} | {tpc_head} |
|{sep}|
| after joint phase ({acc_j['prompts']} prompts) | {_acc_rows(acc_j)} |
| after MTP phase ({acc_m['prompts']} prompts) | {_acc_rows(acc_m)} |
{_refine_row(summary)}| **shipped** ({final['prompts']} prompts, {final['generated_tokens']} tokens) | {_acc_rows(final)} |

## Answer quality (torch, temperature 0)

Of the {quality.get('answers', 0)} held-out questions, the greedy answer names
the object asked about in {100 * quality.get('names_object', 0):.0f}% and also
contains its docstring's first sentence word for word in
{100 * quality.get('correct', 0):.0f}%.

{_tools_section(summary)}
## Engine benchmarks

Measured with `python -m engine bench` (see the project README).
"""


def write_readme(out_dir: Path, summary: dict, *, out: str) -> Path:
    weights = out_dir / "model.safetensors"
    path = out_dir / "README.md"
    path.write_text(render(summary, out=out, weights_bytes=weights.stat().st_size),
                    encoding="utf-8")
    return path
