"""``generate``: one completion, streamed to stdout (or one JSON object with ``--json``)."""
from __future__ import annotations

import json
import sys

from engine.errors import GenerationError
from engine.types import DRAFT_MODES, MAX_DEPTH

HELP = "generate text with plain (depth 0) or MTP speculative decoding"


def add_model_arguments(p) -> None:
    """--model and --dtype, shared by the verbs that load a model."""
    p.add_argument("--model", default=None, help="model folder (default: the embedded demo model)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)


def add_arguments(p) -> None:
    add_model_arguments(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-ids", help="comma-separated token ids")
    p.add_argument("--chat", action="store_true", help="wrap --prompt as a user message in the chat template")
    p.add_argument("--image", action="append", default=[], metavar="FILE",
                   help="an image for the user turn, before the text (repeatable; with --chat, "
                        "on a model with a vision encoder)")
    p.add_argument("--system", default=None, help="system prompt (with --chat)")
    p.add_argument("--no-think", action="store_true", help="disable thinking where the template supports it")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--depth", default="auto",
                   help=f"drafts per cycle, 0..{MAX_DEPTH}, or auto (default: chosen per cycle; 0 = plain "
                        "decoding, also what auto does on a model without an MTP head)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], type=_stop,
                   help="stop string (repeatable; not empty)")
    p.add_argument("--draft-mode", choices=DRAFT_MODES, default="filtered",
                   help="how the MTP head drafts at temperature > 0 (all exact): the target's "
                        "filters (default), softmax only, or its argmax")
    p.add_argument("--memory-budget", default=None, help="memory the process may use, e.g. "
                   "8GB: a prompt that would pass it is refused, a reply that would is cut "
                   "short (default: MLX's recommended working set on a Mac, else 70%% of RAM)")
    p.add_argument("--trace", action="store_true", help="per-cycle drafted/accepted lists (with --json)")
    from engine.distributed.launch import add_arguments as add_cluster_arguments

    add_cluster_arguments(p)


def _stop(text: str) -> str:
    """An argparse type: a stop string, which cannot be empty (it would match at once; the
    server refuses one too)."""
    if not text:
        import argparse

        raise argparse.ArgumentTypeError("a stop string cannot be empty")
    return text


def parse_depth(s: str):
    if s == "auto":
        return "auto"
    try:
        return int(s)
    except ValueError:
        raise GenerationError(f"--depth must be 0..{MAX_DEPTH} or auto, not {s!r}") from None


def parse_ids(text: str) -> list[int]:
    """``--prompt-ids``: comma-separated integers (the range is checked by ``generate``)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise GenerationError(
            f"--prompt-ids must be comma-separated integers, not {text!r}") from None


def prompt_ids(model, args) -> list[int]:
    images = getattr(args, "image", None) or []
    if images and (args.prompt_ids is not None or not args.chat):
        raise GenerationError("--image goes with --chat --prompt TEXT (the images are put "
                              "before the text of the user turn).")
    if args.prompt_ids is not None:
        return parse_ids(args.prompt_ids)
    if args.chat:
        msgs = ([{"role": "system", "content": args.system}] if args.system else [])
        content = args.prompt
        if images:
            content = [{"type": "image", "image": im} for im in read_images(images)]
            content.append({"type": "text", "text": args.prompt})
        msgs.append({"role": "user", "content": content})
        if images:
            return model.chat_prompt(msgs, enable_thinking=False if args.no_think else None)
        return model.chat_ids(msgs, enable_thinking=False if args.no_think else None)
    return list(model.tokenizer.encode(args.prompt, add_special_tokens=False))


def read_images(paths: list[str]) -> list:
    """``--image`` files decoded (``engine.vision.image_io``, its limits); one line each
    for a missing, unreadable or bad file."""
    from engine.vision.image_io import DEFAULT_LIMITS, ImageError, check_count, decode_image

    try:
        check_count(len(paths), DEFAULT_LIMITS)
    except ImageError as exc:
        raise GenerationError(str(exc)) from None
    out = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read(DEFAULT_LIMITS.max_bytes + 1)
        except OSError as exc:
            raise GenerationError(f"--image {path}: {exc.strerror or exc}") from None
        try:
            out.append(decode_image(data, DEFAULT_LIMITS))
        except ImageError as exc:
            raise GenerationError(f"--image {path}: {exc}") from None
    return out


class EmptyThinkFilter:
    """Drops a leading empty ``<think></think>`` block from streamed text (what Qwen-style
    templates produce with thinking off, or a model that chose not to think); a block with
    content, or text without one, passes through unchanged."""

    _OPEN, _CLOSE = "<think>", "</think>"

    def __init__(self) -> None:
        self.buf: str | None = ""  # None once decided

    def feed(self, text: str) -> str:
        if self.buf is None:
            return text
        self.buf += text
        head = self.buf.lstrip()
        if not head:
            return ""
        if not head.startswith(self._OPEN):
            return self._release(self.buf) if not self._OPEN.startswith(head) else ""
        inner = head[len(self._OPEN):].lstrip()
        if not inner:
            return ""
        if not inner.startswith(self._CLOSE):
            return self._release(self.buf) if not self._CLOSE.startswith(inner) else ""
        rest = inner[len(self._CLOSE):].lstrip()
        return self._release(rest) if rest else ""

    def flush(self) -> str:
        """End of stream: whatever is still held back (an empty block alone yields "")."""
        text, self.buf = self.buf or "", None
        head = text.strip()
        empty_block = head.startswith(self._OPEN) and head[len(self._OPEN):].strip() == self._CLOSE
        return "" if empty_block or not head else text

    def _release(self, text: str) -> str:
        self.buf = None
        return text


def json_report(tally, *, trace: bool = False) -> dict:
    """``generate --json``: the reply and its ``ReplySummary`` figures. Acceptance by position
    comes in both kinds (``engine.metrics.summary``): ``acceptance_rate_by_position`` (accepted /
    drafted) and ``conditional_acceptance_by_position`` (accepted / reached)."""
    from engine.metrics.summary import round_rates

    s = tally.summary()
    d = {"token_ids": tally.token_ids, "text": tally.text, "finish_reason": s.finish_reason,
         "stats": {
             "tokens": s.tokens, "prompt_tokens": s.prompt_tokens, "ttft_s": round(s.ttft_s, 6),
             "decode_tokens_per_s": round(s.tokens_per_s, 3), "cycles": s.cycles,
             "drafted": s.drafted, "accepted": s.accepted,
             "tokens_per_cycle": round(s.tokens_per_cycle, 4),
             "acceptance_rate_by_position": round_rates(p.rate for p in s.positions),
             "conditional_acceptance_by_position": round_rates(p.conditional for p in s.positions),
             "draft_acceptance": s.draft_acceptance,
             "host_syncs_per_cycle": s.host_syncs_per_cycle,
             "speculative_cycles": s.speculative_cycles}}
    if trace:
        d["trace"] = [{"depth": c.depth, "drafted": list(c.drafted), "accepted": c.accepted,
                       "emitted": list(c.emitted), "kind": c.extra_kind,
                       "reason": c.depth_reason, "t_total": round(c.t_total, 6)}
                      for c in tally.cycles]
    return d


def _sampling(args):
    from engine import SamplingParams

    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                          min_p=args.min_p, presence_penalty=args.presence_penalty,
                          frequency_penalty=args.frequency_penalty)


def within_budget(model, ids: list[int], args) -> tuple[int, str]:
    """(max_tokens cut to the memory budget, a note when cut); raises MemoryRefused
    (shown as a one-line error) when the prompt alone does not fit."""
    from engine.core.memory import MemoryGate, cut_note, parse_budget

    gate = MemoryGate(parse_budget(args.memory_budget) if args.memory_budget else None)
    gate.attach(model)
    _, max_tokens = gate.verdict("cli", len(ids), args.max_tokens, parse_depth(args.depth))
    return max_tokens, "" if max_tokens >= args.max_tokens else cut_note(max_tokens, gate.budget)


def run(args) -> int:
    from engine import default_model_path, load

    if args.hostfile:
        return _run_cluster(args)
    model = load(args.model or default_model_path(), dtype=args.dtype)
    ids = prompt_ids(model, args)
    max_tokens, note = within_budget(model, ids, args)
    events = model.generate(ids, max_tokens=max_tokens, depth=parse_depth(args.depth),
                            sampling=_sampling(args), seed=args.seed,
                            stop_strings=tuple(args.stop), draft_mode=args.draft_mode)
    _report(args, events, note=note)
    return 0


def _report(args, events, extra=None, note: str = "") -> None:
    """Stream ``events`` to stdout (or one JSON object, with ``extra()`` merged in);
    ``note``: said on stderr when the reply ends at its length (the memory budget's cut)."""
    from engine.metrics.summary import ReplyTally

    tally = ReplyTally()
    shown = EmptyThinkFilter() if args.chat else None
    for ev in events:
        tally.add(ev)
        if not args.json:
            sys.stdout.write(shown.feed(ev.text) if shown else ev.text)
            sys.stdout.flush()
    if shown and not args.json:
        sys.stdout.write(shown.flush())
    if note and tally.summary().finish_reason == "length":
        print(f"\n{note}", file=sys.stderr)
    if args.json:
        print(json.dumps({**json_report(tally, trace=args.trace), **(extra() if extra else {})}))
    else:
        s = tally.summary()
        print(f"\n[{s.tokens} tokens, {s.tokens_per_s:.1f} tok/s, TTFT "
              f"{s.ttft_s * 1000:.0f} ms, {s.tokens_per_cycle:.2f} tokens/cycle, "
              f"finish: {s.finish_reason}]", file=sys.stderr)


def _run_cluster(args) -> int:
    """``--hostfile``: the launcher starts every rank through mlx.launch; rank 0 generates
    on its ``LeaderDecoder`` and the other ranks follow (``engine.distributed``)."""
    from engine.distributed import launch, node
    from engine.distributed.lockstep import LeaderDecoder

    if not launch.in_cluster():
        return launch.run_launcher(args.argv, args)
    cluster, model = node.start(args)
    if cluster.rank != 0:
        return node.run_follower(cluster, model, args)
    cluster.on_stall = node.exit_on_stall(cluster)
    if getattr(args, "image", None):
        raise GenerationError("--image is not supported on a cluster (--hostfile) yet.")
    depth = parse_depth(args.depth)
    dec = LeaderDecoder(cluster, model, max_streams=1,
                        use_mtp=depth != 0 and model.mtp is not None)
    dec.add(prompt_ids(model, args), max_tokens=args.max_tokens, depth=depth,
            sampling=_sampling(args), seed=args.seed, stop_strings=tuple(args.stop),
            draft_mode=args.draft_mode)
    counted = node.RoundCounter(cluster)

    def events():
        while dec.busy:
            for part in (dec.admit_step, dec.cycle_step):  # counted from the first token on
                for _, ev in part():
                    counted.saw(ev)
                    yield ev
    _report(args, events(), lambda: {"cluster": counted.report()})
    return node.finish(cluster, 0)
