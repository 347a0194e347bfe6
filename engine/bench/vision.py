"""``python -m engine.bench.vision``: what one image costs, on random models built in process.

Two shapes (``--shape tiny|0.8b|both``): the tests' tiny vision model (2 vision blocks of width
32, 8-pixel patches; a 64-wide, 4-layer trunk) and Qwen3.5-0.8B's real shapes (vision: 12
blocks of width 768, 12 heads, MLP 3072, 16-pixel patches, merge 2, 2304 position embeddings,
out 1024; trunk: 24 layers of width 1024 (18 Gated DeltaNet, 6 gated attention with 8 heads of
256, 2 KV heads), MLP 3584, vocabulary 248320, one MTP layer), float32, random weights.

For one 1024x768 image (Qwen's preprocessing keeps 1024x768: a 64x48 patch grid, 768 image
tokens at patch 16) it prints time to first token split into image preprocessing (numpy),
the encoder, the prefill (trunk and MTP head over the prompt) and the first token; then the
MTP speed-up (decode tokens/s at ``--depth`` over depth 0) after the image against the
same request without the image (text only). Random weights: the head's acceptance is
whatever chance gives, so each speed-up is printed with its acceptance; what the comparison
shows is whether decoding past an image (M-RoPE shifted offsets) costs more per cycle than
text. Timings are wall-clock on whatever else the machine runs: repeat and compare.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
            "<|vision_end|>", "<|image_pad|>"]
SHAPES = {
    "tiny": dict(
        text=dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                  linear_value_head_dim=16, rope_theta=10000.0, partial=0.5,
                  mrope_section=[2, 1, 1]),
        vision=dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=8,
                    out_hidden_size=64, num_position_embeddings=64),
        # the budget that gives a 1024x768 image as many tokens as Qwen's 16-pixel patches
        max_pixels=16 * 16 * 768),
    "0.8b": dict(
        text=dict(vocab_size=248320, hidden_size=1024, intermediate_size=3584,
                  num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2,
                  head_dim=256, linear_num_value_heads=16, linear_num_key_heads=16,
                  linear_key_head_dim=128, linear_value_head_dim=128, rope_theta=1e7,
                  partial=0.25, mrope_section=[11, 11, 10]),
        vision=dict(depth=12, hidden_size=768, num_heads=12, intermediate_size=3072,
                    patch_size=16, out_hidden_size=1024, num_position_embeddings=2304)),
}


def _tokenizer(folder: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["Describe the picture in detail. What is in this image? " * 20],
                            trainer=trainers.BpeTrainer(
                                vocab_size=300, special_tokens=SPECIALS, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (folder / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "model_max_length": 32768}), encoding="utf-8")
    return {t: tok.token_to_id(t) for t in SPECIALS}


def random_model(shape: str, folder: Path, seed: int = 0):
    """A ``Model`` of ``shape`` with random float32 weights (trunk, MTP head, vision)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models.qwen3_5 import TextModelArgs

    from engine.models.checkpoint import parse_config
    from engine.models.families.qwen3_5 import build_trunk
    from engine.models.loading import load_tokenizer
    from engine.models.model import Model
    from engine.models.mtp import MTPHead
    from engine.types import MAX_DEPTH, ModelInfo
    from engine.vision.encoder import VisionEncoder

    t, v = SHAPES[shape]["text"], SHAPES[shape]["vision"]
    ids = _tokenizer(folder)
    if "max_pixels" in SHAPES[shape]:
        (folder / "preprocessor_config.json").write_text(json.dumps(
            {"size": {"shortest_edge": 4096, "longest_edge": SHAPES[shape]["max_pixels"]}}))
    L = t["num_hidden_layers"]
    text = {k: t[k] for k in t if k not in ("rope_theta", "partial", "mrope_section")}
    text.update(model_type="qwen3_5_text", rms_norm_eps=1e-6, max_position_embeddings=32768,
                linear_conv_kernel_dim=4, full_attention_interval=4,
                layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                             for i in range(L)], tie_word_embeddings=True, hidden_act="silu",
                mtp_num_hidden_layers=1, eos_token_id=ids["<|im_end|>"],
                rope_parameters={"rope_type": "default", "rope_theta": t["rope_theta"],
                                 "partial_rotary_factor": t["partial"],
                                 "mrope_section": t["mrope_section"],
                                 "mrope_interleaved": True})
    vision = dict(v, in_channels=3, spatial_merge_size=2, temporal_patch_size=2,
                  hidden_act="gelu_pytorch_tanh")
    raw = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
           "text_config": text, "vision_config": vision, "tie_word_embeddings": True,
           "image_token_id": ids["<|image_pad|>"], "vision_start_token_id":
           ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"]}
    cfg = parse_config(raw)
    trunk, mtp = build_trunk(cfg), MTPHead(TextModelArgs.from_dict(dict(text)), 1)
    enc = VisionEncoder(vision)
    mx.random.seed(seed)
    for module in (trunk, mtp, enc):
        module.update(tree_unflatten([(k, _random(k, p)) for k, p in
                                      tree_flatten(module.parameters())]))
        mx.eval(module.parameters())
    n = sum(p.size for m in (trunk, mtp) for _, p in tree_flatten(m.parameters()))
    info = ModelInfo(path=str(folder), name=f"random-{shape}", architecture=raw["architectures"][0],
                     family="qwen3_5", layout="mlx", num_parameters=int(n), bytes_on_disk=0,
                     quantization=None, has_mtp=True, mtp_layers=1, max_depth=MAX_DEPTH,
                     context_length=32768, vocab_size=t["vocab_size"],
                     hidden_size=t["hidden_size"], num_layers=L, dtype="float32",
                     eos_token_ids=(ids["<|im_end|>"],), vision=True)
    return Model(trunk=trunk, mtp=mtp, tokenizer=load_tokenizer(folder), info=info,
                 vision=enc, vision_config={k: raw.get(k) for k in (
                     "image_token_id", "vision_start_token_id", "vision_end_token_id",
                     "vision_config")}), ids


def _random(name: str, p):
    import mlx.core as mx

    if name.endswith("A_log"):
        return mx.log(mx.random.uniform(1, 8, p.shape))
    if name.endswith("dt_bias"):
        return mx.random.uniform(0.5, 1.5, p.shape)
    if name.endswith("bias"):
        return mx.zeros(p.shape)
    if p.ndim == 1:  # norm scales (MLX layout: scale = w)
        return 1 + 0.1 * mx.random.normal(p.shape)
    fan_in = int(np.prod(p.shape[1:])) if p.ndim > 2 else p.shape[-1]
    scale = 0.5 if "conv1d" in name else (1.0 if "embed" in name else fan_in ** -0.5)
    return scale * mx.random.normal(p.shape)


def picture(h: int = 768, w: int = 1024):
    """A 1024x768 image with structure (gradients, blocks, noise), as a DecodedImage."""
    from engine.vision.image_io import from_pixels

    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), ((x // 64 + y // 48) % 2) * 200], -1)
    img = img + np.random.default_rng(0).integers(0, 30, img.shape)
    return from_pixels(np.clip(img, 0, 255).astype(np.uint8))


def prompts(model, ids: dict, image) -> tuple:
    """(the image prompt, the same request with text in place of the image: as many tokens,
    no image, so both decode over the same context length), built by hand: the random
    models' tokenizer has no chat template."""
    from engine.vision.preprocess import fit_size
    from engine.vision.prompt import ImagePrompt, PlacedImage

    cfg = model.image_config
    text = model.tokenizer.encode("Describe the picture in detail.", add_special_tokens=False)
    head = [ids["<|im_start|>"]] + model.tokenizer.encode("user\n", add_special_tokens=False)
    tail = [ids["<|im_end|>"], ids["<|im_start|>"]] + \
        model.tokenizer.encode("assistant\n", add_special_tokens=False)
    h, w = fit_size(image.height, image.width, cfg)
    n = (h // cfg.factor) * (w // cfg.factor)
    start = len(head) + 1
    ids_img = head + [ids["<|vision_start|>"]] + [ids["<|image_pad|>"]] * n + \
        [ids["<|vision_end|>"]] + text + tail
    placed = PlacedImage(start, n, (1, h // cfg.patch_size, w // cfg.patch_size), image)
    filler = (text * (n // len(text) + 1))[:n]
    return ImagePrompt(ids_img, [placed]), head + [ids["<|vision_start|>"]] + filler + \
        [ids["<|vision_end|>"]] + text + tail


def ttft(model, prompt) -> dict:
    """Seconds: preprocessing, encoder, prefill, first token (a fresh session, no cache)."""
    import mlx.core as mx

    from engine.decoding.session import Session

    stats = model.vision_stats
    before = dict(stats)
    t0 = time.perf_counter()
    s = Session.fresh(model, use_mtp=True)
    for _ in s.prefill_chunks(list(prompt), prompt.images):
        pass
    mx.eval(s.last_hidden, [c.state for c in s.trunk_cache], [c.state for c in s.mtp_cache])
    t1 = time.perf_counter()
    mx.eval(mx.argmax(s.last_logits, axis=-1))
    t2 = time.perf_counter()
    pre = stats["preprocess_s"] - before["preprocess_s"]
    enc = stats["encoder_s"] - before["encoder_s"]
    return {"preprocess_s": pre, "encoder_s": enc, "prefill_s": t1 - t0 - pre - enc,
            "first_token_s": t2 - t1, "total_s": t2 - t0, "prompt_tokens": len(prompt),
            "image_tokens": prompt.images[0].tokens}


def speed(model, prompt, depth: int, tokens: int, replay=None) -> dict:
    """Decode figures of one greedy reply (``replay``: drafts are the known reply's tokens,
    all accepted: the cost of a cycle at full acceptance). The prompt cache is kept: a run
    after one on the same prompt resumes from its state (decode speed is what is measured)."""
    from engine.decoding.drafters import ReplayDrafter
    from engine.metrics.summary import ReplyTally

    tally = ReplyTally()
    drafter = None if replay is None else ReplayDrafter(replay)
    for ev in model.generate(prompt, max_tokens=tokens, depth=depth, drafter=drafter):
        tally.add(ev)
    s = tally.summary()
    return {"tok_s": s.tokens_per_s, "tokens_per_cycle": s.tokens_per_cycle,
            "tokens": tally.token_ids}


def _ttft_lines(model, prompt, shape: str, built: float, out: dict) -> None:
    ttft(model, prompt)  # warm-up: compiles, allocations
    t = out["ttft"] = ttft(model, prompt)
    print(f"[{shape}] built in {built:.1f} s; 1024x768 image = {t['image_tokens']} "
          f"tokens, prompt {t['prompt_tokens']} tokens", flush=True)
    print(f"  TTFT {t['total_s'] * 1000:.0f} ms = preprocess {t['preprocess_s'] * 1000:.0f}"
          f" + encoder {t['encoder_s'] * 1000:.0f} + prefill {t['prefill_s'] * 1000:.0f}"
          f" + first token {t['first_token_s'] * 1000:.0f} ms", flush=True)


def run(shape: str, depth: int, tokens: int, repeats: int, with_ttft: bool = True) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model, ids = random_model(shape, Path(tmp))
        built = time.perf_counter() - t0
        with_image, text_only = prompts(model, ids, picture())
        out = {"shape": shape, "build_s": built}
        if with_ttft:
            _ttft_lines(model, with_image, shape, built, out)
        runs: dict = {}
        for name, p in (("image", with_image), ("text", text_only)):
            speed(model, p, depth, 4)  # warm-up (and the prompt's state, with the head's)
            speed(model, p, 0, 4)
            for _ in range(repeats):  # medians: the machine's load moves every run
                mtp, base = speed(model, p, depth, tokens), speed(model, p, 0, tokens)
                replay = speed(model, p, depth, tokens, replay=base["tokens"])
                assert base["tokens"] == mtp["tokens"] == replay["tokens"], \
                    "greedy MTP must equal plain decoding"
                r = runs.setdefault(name, {"plain": [], "mtp": [], "replay": []})
                r["plain"].append(base["tok_s"])
                r["mtp"].append(mtp["tok_s"])
                r["replay"].append(replay["tok_s"])
                r["tpc"], r["replay_tpc"] = mtp["tokens_per_cycle"], replay["tokens_per_cycle"]
        for name, r in runs.items():
            plain = statistics.median(r["plain"])
            out[name] = {"plain_tok_s": plain, "mtp_tok_s": statistics.median(r["mtp"]),
                         "speedup": statistics.median(r["mtp"]) / plain,
                         "tokens_per_cycle": r["tpc"],
                         "replay_speedup": statistics.median(r["replay"]) / plain,
                         "replay_tokens_per_cycle": r["replay_tpc"]}
        return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=("tiny", "0.8b", "both"), default="both")
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5, help="runs per prompt (medians)")
    p.add_argument("--no-ttft", action="store_true", help="decode figures only")
    args = p.parse_args(argv)
    import engine  # noqa: F401 - picks the BLAS before mlx

    for shape in (("tiny", "0.8b") if args.shape == "both" else (args.shape,)):
        r = run(shape, args.depth, args.tokens, args.repeats, not args.no_ttft)
        for name in ("image", "text"):
            s = r[name]
            print(f"  {name:5s}: depth 0 {s['plain_tok_s']:.1f} tok/s; depth {args.depth}: "
                  f"head x{s['speedup']:.2f} ({s['tokens_per_cycle']:.2f} tokens/cycle), "
                  f"replayed reply x{s['replay_speedup']:.2f} "
                  f"({s['replay_tokens_per_cycle']:.2f} tokens/cycle)")
        for key, what in (("speedup", "head"), ("replay_speedup", "replayed reply")):
            ratio = r["image"][key] / r["text"][key]
            print(f"  MTP speed-up ({what}) after the image / text only: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
