"""The demo-model trainer: a tiny run's files, layout and numerics, and the MTP head's semantics."""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the trainer needs the 'train' extra (PyTorch)")

from engine.training import tokenizer as tk  # noqa: E402
from engine.training import trainer  # noqa: E402
from engine.training.export import export_model, read_export  # noqa: E402
from engine.training.model import TINY_SIZE, build_model  # noqa: E402
from engine.training.reference import reference_draft_chains, reference_logits  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[2] / "resources" / "models" / "mtp-demo-qwen3_5"
IDS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<think>": 3, "</think>": 4}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "model"
    events: list[dict] = []
    # the MTP phase on a stream of its own with only question/answer windows (the CLI's
    # determinism test below runs the default: the joint phase's stream goes on)
    cfg = replace(trainer.config_for(tiny=True, steps=None, seed=0), mtp_tool_share=0.0)
    summary = trainer.train_demo(out, cfg, events.append)
    return out, events, summary


@pytest.fixture(scope="module")
def random_export(tmp_path_factory):
    """An untrained tiny model exported to disk, plus the in-memory model."""
    out = tmp_path_factory.mktemp("random")
    torch.set_num_threads(1)
    model = build_model(TINY_SIZE, vocab_size=256, eos_token_id=2, pad_token_id=0, seed=3)
    with torch.no_grad():  # make every norm non-trivial so a missing/double +1 shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.3, 0.3)
    export_model(model, TINY_SIZE, out, ids=IDS)
    return out, model.eval()


def _header(path: Path) -> dict:
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def test_tiny_run_writes_raw_hf_layout(tiny_run):
    out, _, summary = tiny_run
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "heldout_prompts.json", "training.json"} <= names
    assert not any(n.endswith((".bin", ".pt", ".pth", ".pkl")) for n in names)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert cfg["model_type"] == "qwen3_5" and cfg["tie_word_embeddings"] is True
    text = cfg["text_config"]
    assert text["model_type"] == "qwen3_5_text" and text["mtp_num_hidden_layers"] == 1
    assert text["full_attention_interval"] == 4
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert text["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert text["vocab_size"] == summary["vocab_size"]
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [IDS["<|im_end|>"], IDS["<|endoftext|>"]]
    prompts = json.loads((out / "heldout_prompts.json").read_text())
    assert prompts and all(isinstance(p, str) and p for p in prompts)


def test_tiny_run_tensor_names_and_shapes(tiny_run):
    out, _, _ = tiny_run
    cfg, weights = read_export(out)
    text = cfg["text_config"]
    h, heads, hd = text["hidden_size"], text["num_attention_heads"], text["head_dim"]
    assert all(k.startswith(("model.language_model.", "mtp.")) for k in weights)
    assert not any("lm_head" in k for k in weights)  # tied
    assert tuple(weights["mtp.fc.weight"].shape) == (h, 2 * h)
    for k in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        assert tuple(weights[f"mtp.{k}.weight"].shape) == (h,)
    assert tuple(weights["mtp.layers.0.self_attn.q_proj.weight"].shape) == (2 * heads * hd, h)
    for k in ("q_norm", "k_norm"):
        assert tuple(weights[f"mtp.layers.0.self_attn.{k}.weight"].shape) == (hd,)
    for k in ("gate_proj", "up_proj", "down_proj"):
        assert f"mtp.layers.0.mlp.{k}.weight" in weights
    conv = weights["model.language_model.layers.0.linear_attn.conv1d.weight"]
    assert conv.dim() == 3 and conv.shape[1] == 1 and conv.shape[2] == text["linear_conv_kernel_dim"]
    assert "model.language_model.layers.3.self_attn.q_proj.weight" in weights
    # Zero-centred norms (scale = 1 + w): stored weights sit near 0, not near 1. The gated norm
    # inside Gated DeltaNet is the exception (plain scale, near 1).
    for k, v in weights.items():
        if k.endswith("norm.weight"):
            centre = 1.0 if ".linear_attn.norm." in k else 0.0
            assert abs(float(v.float().mean()) - centre) < 0.5, k
    assert all(v.dtype == torch.float32 for v in weights.values())


def test_tiny_run_reports_progress_and_learns(tiny_run):
    _, events, summary = tiny_run
    steps = [e for e in events if e["event"] == "step"]
    joint = [e for e in steps if e["phase"] == "joint"]
    assert {"loss", "mtp_loss", "tokens_per_s", "eta_s", "elapsed_s"} <= set(joint[0])
    assert joint[-1]["loss"] < joint[0]["loss"]
    assert [e["phase"] for e in steps if e["phase"] != "joint"][-1] == "refine"
    assert any(e["phase"] == "mtp" for e in steps)
    evals = [e for e in events if e["event"] == "eval"]
    assert [e["after"] for e in evals] == ["joint", "mtp", "refine", "final", "tools"]
    assert summary["acceptance_after_refine"]["prompts"] == 3
    assert len(evals[-2]["acceptance"]) == 3
    assert summary["chosen_head"] in ("joint", "mtp")
    # the tool chats were trained on and measured on names in none of them
    assert summary["tool_chats"] > 0 and summary["tool_tokens"] > 0
    assert summary["tools_final"]["prompts"] == 4
    assert {"calls", "answers", "exact"} <= set(summary["tools_final"])
    # ... with the head's acceptance on those answers, as on the question/answer prompts
    assert len(summary["tools_final"]["acceptance"]) == 3
    assert set(summary["tools_final"]["tokens_per_cycle"]) == {1, 2, 3}
    readme = (tiny_run[0] / "README.md").read_text()
    assert "--mtp-tool-share 0.0" in readme and "(0% from the tool chats)" in readme


def test_tokenizer_loads_with_transformers(tiny_run):
    from transformers import AutoTokenizer

    out, _, _ = tiny_run
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids(list(IDS)) == list(IDS.values())
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What does `json.dumps` do?"}]
    off = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                  enable_thinking=False)
    on = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert off == on + "<think>\n\n</think>\n\n"
    assert on.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert off == tk.render_chat(msgs, add_generation_prompt=True, enable_thinking=False)
    ids = tok.encode(off)
    assert ids.count(IDS["<|im_start|>"]) == 3 and IDS["<think>"] in ids
    assert tok.decode(ids) == off
    history = msgs[1:] + [{"role": "assistant", "content": "<think>\n\n</think>\n\nIt dumps."},
                          {"role": "user", "content": "And loads?"}]
    rendered = tok.apply_chat_template(history, tokenize=False)
    assert "<|im_start|>assistant\nIt dumps.<|im_end|>\n" in rendered  # history drops think


def test_assistant_mask_covers_answers_only(tiny_run):
    from tokenizers import Tokenizer

    out, _, _ = tiny_run
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What does `a.b` do?"},
            {"role": "assistant", "content": "It does X."},
            {"role": "user", "content": "assistant?"},
            {"role": "assistant", "content": "Y\nZ."}]
    ids = tok.encode(tk.render_chat(msgs)).ids
    mask = trainer.assistant_mask(ids, tok)
    kept = tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert kept == "It does X.<|im_end|><think>\n\n</think>\n\nY\nZ.<|im_end|>"


def test_reference_logits_roundtrip(random_export):
    out, model = random_export
    ids = [1, 50, 60, 70, 80, 2, 90, 100, 33, 7]
    trunk, mtp = reference_logits(out, ids)
    assert trunk.shape == (len(ids), 256) and mtp.shape == (len(ids) - 1, 256)
    x = torch.tensor([ids])
    with torch.no_grad():
        hidden, logits = model.trunk_forward(x)
        want = model.mtp_chains(hidden, x, 1)[0][0].numpy()
    np.testing.assert_allclose(trunk, logits[0].numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(mtp, want, rtol=0, atol=1e-5)


def _spec_mtp_step1(model, hidden: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """MTP_SPEC §2 step 1 written out with transformers' own decoder layer forward."""
    from transformers.masking_utils import create_causal_mask

    mtp, emb = model.mtp, model.embed
    x = torch.tensor([ids[1:]])
    e = mtp.pre_fc_norm_embedding(emb(x))
    h = mtp.pre_fc_norm_hidden(hidden[:, :-1])
    z = mtp.fc(torch.cat([e, h], dim=-1))  # embedding first, hidden second
    pos = torch.arange(z.shape[1])[None]
    cos, sin = model.trunk.model.rotary_emb(z, pos)
    mask = create_causal_mask(config=model.config, inputs_embeds=z, attention_mask=None,
                              cache=None, position_ids=pos)
    out = mtp.layers[0](z, position_embeddings=(cos, sin), attention_mask=mask,
                        position_ids=pos)
    return torch.nn.functional.linear(mtp.norm(out), emb.weight)[0]


def test_mtp_step1_matches_transformers_decoder_layer(random_export):
    _, model = random_export
    ids = [1, 9, 8, 7, 6, 5, 4, 2, 11, 12, 13]
    x = torch.tensor([ids])
    with torch.no_grad():
        hidden, _ = model.trunk_forward(x)
        got = model.mtp_chains(hidden, x, 1)[0][0]
        want = _spec_mtp_step1(model, hidden, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_draft_chains_match_incremental_decoding(random_export):
    """Parallel chains == one-row-at-a-time drafting over an MTP KV cache (MTP_SPEC §2-3)."""
    out, model = random_export
    ids = [1, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]
    depth = 3
    chains = reference_draft_chains(out, ids, depth)
    x = torch.tensor([ids])
    mtp, rotary = model.mtp, model.trunk.model.rotary_emb
    with torch.no_grad():
        hidden, _ = model.trunk_forward(x)
        for t in (0, 4, len(ids) - 2 - depth):
            # Cache: one step-1 row per committed pair (h_p, x_{p+1}), p < t.
            past = None
            for p in range(t + 1):
                z = mtp.fc(torch.cat([mtp.pre_fc_norm_embedding(model.embed(x[:, p + 1:p + 2])),
                                      mtp.pre_fc_norm_hidden(hidden[:, p:p + 1])], -1))
                cos, sin = rotary(z, torch.tensor([[p]]))
                n_past = 0 if past is None else past[0].shape[2]
                y, k, v = mtp.layer_forward(z, cos, sin, past, torch.ones(1, n_past + 1,
                                                                          dtype=torch.bool))
                past = (k, v)
            g = mtp.norm(y)
            for s in range(1, depth + 1):
                logits = torch.nn.functional.linear(g, model.embed.weight)[0, 0]
                np.testing.assert_allclose(chains[s - 1][t], logits.numpy(), atol=1e-4)
                if s == depth:
                    break
                draft = logits.argmax().view(1, 1)
                z = mtp.fc(torch.cat([mtp.pre_fc_norm_embedding(model.embed(draft)),
                                      mtp.pre_fc_norm_hidden(g)], -1))
                cos, sin = rotary(z, torch.tensor([[t + s]]))
                n_past = past[0].shape[2]
                y, k, v = mtp.layer_forward(z, cos, sin, past,
                                            torch.ones(1, n_past + 1, dtype=torch.bool))
                past = (k, v)
                g = mtp.norm(y)


def test_training_is_deterministic_across_processes(tmp_path):
    """Same seed -> byte-identical tokenizer and weights, in this process and in a fresh one."""
    import subprocess
    import sys

    cfg = trainer.config_for(tiny=True, steps=3, seed=5)
    trainer.train_demo(tmp_path / "a", cfg, lambda ev: None)
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "engine", "train-demo", "--tiny", "--steps", "3",
                    "--seed", "5", "--out", str(tmp_path / "b")], cwd=root, check=True,
                   capture_output=True)
    for name in ("model.safetensors", "tokenizer.json", "heldout_prompts.json",
                 "heldout_tools.json"):
        digests = [hashlib.sha256((tmp_path / run / name).read_bytes()).digest()
                   for run in ("a", "b")]
        assert digests[0] == digests[1], name


def _engine_or_skip():
    try:
        import engine.models.model  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"engine.models.model is not importable yet ({exc})")
    import engine

    return engine


def _greedy(model, ids: list[int], depth: int, n: int) -> list[int]:
    from engine.types import SamplingParams

    out: list[int] = []
    for ev in model.generate(ids, max_tokens=n, depth=depth,
                             sampling=SamplingParams(temperature=0.0)):
        out += list(ev.token_ids or ())
    return out


def test_engine_loads_tiny_run_and_matches_torch(tiny_run):
    from engine.training.acceptance import greedy_generate
    from engine.training.reference import load_model

    engine = _engine_or_skip()
    out, _, _ = tiny_run
    model = engine.load(out)
    assert model.info.has_mtp and model.info.mtp_layers == 1
    ids = model.chat_ids([{"role": "user", "content": "What does `abc.abstractmethod` do?"}],
                         enable_thinking=False)
    plain = _greedy(model, ids, 0, 8)
    assert _greedy(model, ids, 2, 8) == plain
    ref = greedy_generate(load_model(out), ids, max_new=8, eos=set())[len(ids):]
    assert plain == ref[:len(plain)]


def test_shipped_model_layout():
    if not (SHIPPED / "config.json").exists():
        pytest.skip("the demo model has not been trained into resources/ yet")
    total = sum(p.stat().st_size for p in SHIPPED.iterdir() if p.is_file())
    assert total <= 40 * 1024 * 1024
    header = _header(SHIPPED / "model.safetensors")
    names = [k for k in header if k != "__metadata__"]
    assert any(k.startswith("mtp.") for k in names)
    assert all(k.startswith(("model.language_model.", "mtp.")) for k in names)
    prompts = json.loads((SHIPPED / "heldout_prompts.json").read_text())
    assert len(prompts) >= 32
    assert (SHIPPED / "README.md").exists()


def test_shipped_model_depth2_equals_depth0():
    if not (SHIPPED / "config.json").exists():
        pytest.skip("the demo model has not been trained into resources/ yet")
    engine = _engine_or_skip()
    model = engine.load(SHIPPED)
    prompt = json.loads((SHIPPED / "heldout_prompts.json").read_text())[0]
    ids = model.chat_ids([{"role": "user", "content": prompt}], enable_thinking=False)
    plain = _greedy(model, ids, 0, 24)
    assert len(plain) > 3
    assert _greedy(model, ids, 2, 24) == plain


def test_shipped_model_answers_unseen_phrasings_correctly():
    """Sensible in-domain answers, measured: asked in a phrasing it never trained on, the demo
    model names the object and states its docstring's first sentence word for word."""
    if not (SHIPPED / "heldout.json").exists():
        pytest.skip("the demo model has not been trained into resources/ yet")
    engine = _engine_or_skip()
    model = engine.load(SHIPPED)
    from engine.types import SamplingParams

    heldout = json.loads((SHIPPED / "heldout.json").read_text())[:16]
    greedy = SamplingParams(temperature=0.0)
    correct = 0
    for item in heldout:
        ids = model.chat_ids([{"role": "user", "content": item["prompt"]}],
                             enable_thinking=False)
        text = "".join(ev.text for ev in model.generate(ids, max_tokens=96, depth="auto",
                                                         sampling=greedy))
        correct += item["qualname"] in text and item["first_sentence"] in text
    # 15 of these 16 when shipped (80% over all 64 held-out questions, README); 12 = margin
    assert correct >= 12, f"{correct}/{len(heldout)} correct answers"


def test_mtp_probe_continues_the_head_only_and_measures_both_prompt_sets(tiny_run, tmp_path,
                                                                         capsys):
    from engine.training import mtp_probe

    out, _, summary = tiny_run
    assert mtp_probe.config_of(summary) == replace(
        trainer.config_for(tiny=True, steps=None, seed=0), mtp_tool_share=0.0)
    assert mtp_probe.main(["--model", str(out), "--steps", "2", "--mtp-tool-share", "0.5",
                           "--save", str(tmp_path / "probed")]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    before, after = lines[0]["before"], lines[-1]["after"]
    for got in (before, after):
        assert got["qa"]["prompts"] == 3 and got["tool_answers"]["prompts"] == 4
        assert len(got["tool_answers"]["acceptance"]) == 3
    _, old = read_export(out)
    _, new = read_export(tmp_path / "probed")
    changed = {k for k in old if not torch.equal(old[k], new[k])}
    assert changed and all(k.startswith("mtp.") for k in changed)


def test_refine_alone_on_a_folder_equals_the_full_run(tmp_path):
    """Phase 3 run alone on a phase-2 folder (``train-demo --refine``) writes the same bytes as
    one run of all three phases, and its README gives both ways to reproduce it."""
    import subprocess
    import sys

    from engine.training import refine

    cfg = trainer.config_for(tiny=True, steps=None, seed=2)
    assert cfg.refine_steps == 3
    full = trainer.train_demo(tmp_path / "full", cfg, lambda ev: None)
    trainer.train_demo(tmp_path / "p2", replace(cfg, refine_steps=0), lambda ev: None)
    events: list[dict] = []
    apart = refine.refine_demo(tmp_path / "p2", tmp_path / "p3", steps=3,
                               tool_share=cfg.refine_tool_share, report=events.append)
    assert [e["phase"] for e in events if e["event"] == "step"][-1] == "refine"
    one = (tmp_path / "full" / "model.safetensors").read_bytes()
    assert one == (tmp_path / "p3" / "model.safetensors").read_bytes()
    assert one != (tmp_path / "p2" / "model.safetensors").read_bytes()
    _, p2 = read_export(tmp_path / "p2")
    _, p3 = read_export(tmp_path / "p3")
    changed = {k for k in p2 if not torch.equal(p2[k], p3[k])}
    assert changed and all(k.startswith("mtp.") for k in changed)
    for key in ("acceptance_after_refine", "acceptance_final", "tools_final", "refine_final"):
        assert apart[key] == full[key], key
    assert refine.config_of(apart) == cfg
    text = (tmp_path / "p3" / "README.md").read_text()
    assert "Refine phase, 3 steps" in text and "--refine PHASE2" in text
    assert "after refine phase" in (tmp_path / "full" / "README.md").read_text()
    root = Path(__file__).resolve().parents[2]

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "engine", "train-demo", *args], cwd=root,
                              capture_output=True, text=True, timeout=300)

    for args, why in ((("--refine", str(tmp_path / "p3"), "--out", str(tmp_path / "x")),
                       "already had its refine phase (3 steps)"),
                      (("--refine", str(tmp_path / "p2"), "--out", str(tmp_path / "p2")),
                       "must be another folder"),
                      (("--refine", str(tmp_path), "--out", str(tmp_path / "x")),
                       "has no training.json"),
                      (("--refine", str(tmp_path / "p2"), "--tiny", "--out",
                        str(tmp_path / "x")), "--tiny cannot change a trained folder")):
        got = cli(*args)
        assert got.returncode == 2 and why in got.stderr, (args, got.stderr)
        assert len(got.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("args,why", [(("--steps", "0"), "--steps: invalid 1..1000000 value"),
                                      (("--steps", "-1"), "--steps: invalid 1..1000000 value"),
                                      (("--threads", "0"), "--threads: invalid 1..256 value"),
                                      (("--refine-steps", "-3"),
                                       "--refine-steps: invalid 0..100000 value")])
def test_train_demo_refuses_counts_out_of_range_in_one_line(tmp_path, args, why):
    """``--steps 0`` or ``-1`` trained a one-step model without a word; ``--threads 0`` ended
    in torch's traceback. Each is argparse's one-line error now, before anything is written."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    got = subprocess.run([sys.executable, "-m", "engine", "train-demo", *args, "--tiny", "--out",
                          str(tmp_path / "x")], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 2 and why in got.stderr, got.stderr
    assert got.stderr.strip().splitlines()[-1].startswith("mtpchat-engine train-demo: error:")
    assert not (tmp_path / "x").exists()
