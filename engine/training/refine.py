"""Phase 3 alone: refine the MTP head of an existing ``train-demo`` folder.

``python -m engine train-demo --refine DIR --out OUT`` loads DIR's phase-2 model (a folder whose
``training.json`` has no refine phase yet), runs the trainer's phase 3 on it with the trunk
frozen, and writes OUT with the measured figures, exactly as a full ``train-demo`` run with the
same configuration would have continued: phase 3 depends only on the float32 phase-2 weights,
the tokenizer and the seeded corpus, all of which the folder reproduces. Training stays
deterministic per machine and thread count, so a folder refined here from a folder trained
elsewhere is what that other machine's full run would make only if both machines compute alike.
"""
from __future__ import annotations

import json
import platform
import shutil
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch

from engine.training import corpus, tokenizer, tool_chats, trainer
from engine.training.export import export_model, load_into, read_export
from engine.training.model import DemoModel, ModelSize, build_model

# What a folder from before the refine phase existed did: no phase 3.
_BEFORE_REFINE = {"refine_steps": 0}


def config_of(summary: dict) -> trainer.TrainConfig:
    """The ``TrainConfig`` a ``training.json`` records (fields it lacks keep their defaults,
    except that a folder from before phase 3 existed had none)."""
    saved = {**_BEFORE_REFINE, **summary["config"]}
    size = ModelSize(**saved.pop("size"))
    known = {f.name for f in fields(trainer.TrainConfig)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k in known}
    return replace(trainer.TrainConfig(), size=size, **values)


@dataclass
class Trained:
    """A ``train-demo`` folder loaded into torch with what its training was built from."""

    dir: Path
    summary: dict
    cfg: trainer.TrainConfig
    ids: dict[str, int]
    model: DemoModel
    tok: object
    data: corpus.Corpus

    @property
    def eos(self) -> set[int]:
        return {self.ids[tokenizer.IM_END], self.ids[tokenizer.ENDOFTEXT]}

    @property
    def tool_heldout(self) -> list[dict]:
        path = self.dir / "heldout_tools.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else []

    def streams(self, cfg: trainer.TrainConfig) -> tuple:
        """The question/answer and tool-chat token streams ``train_demo`` trained on."""
        texts = [tokenizer.render_chat(chat) for chat in self.data.train_chats]
        chats = trainer.tool_chat_set(cfg).chats if cfg.tool_share else []
        return (trainer.token_stream(self.tok, self.ids, texts),
                trainer.token_stream(self.tok, self.ids,
                                     [tokenizer.render_chat(c) for c in chats]))


def load_trained(model_dir: Path, threads: int = 1) -> Trained:
    from tokenizers import Tokenizer

    torch.set_num_threads(threads)
    summary = json.loads((model_dir / "training.json").read_text(encoding="utf-8"))
    cfg = config_of(summary)
    ids = summary["token_ids"]
    model = build_model(cfg.size, vocab_size=summary["vocab_size"],
                        eos_token_id=ids[tokenizer.IM_END],
                        pad_token_id=ids[tokenizer.ENDOFTEXT], seed=cfg.seed)
    load_into(model, read_export(model_dir)[1])
    data = corpus.build_corpus(seed=cfg.seed, variants=cfg.corpus_variants,
                               limit_items=cfg.corpus_limit)
    return Trained(model_dir, summary, cfg, ids, model,
                   Tokenizer.from_file(str(model_dir / "tokenizer.json")), data)


def check_refinable(src: Path, out: Path) -> str | None:
    """Why ``src`` cannot be refined into ``out`` (None when it can)."""
    if not (src / "training.json").is_file():
        return f"{src} is not a train-demo folder (it has no training.json)"
    if out.resolve() == src.resolve():
        return "--out must be another folder than --refine (the source stays as it was)"
    summary = json.loads((src / "training.json").read_text(encoding="utf-8"))
    if config_of(summary).refine_steps:
        return f"{src} already had its refine phase ({config_of(summary).refine_steps} steps)"
    return None


def refine_demo(src: Path, out: Path, *, steps: int, tool_share: float,
                report: trainer.Report, threads: int = 1) -> dict:
    """Copy ``src`` to ``out``, run phase 3 there and rewrite its summary and README."""
    t0 = time.monotonic()
    torch.use_deterministic_algorithms(True, warn_only=True)
    run = load_trained(src, threads)
    cfg = replace(run.cfg, refine_steps=steps, refine_tool_share=tool_share, threads=threads)
    shutil.copytree(src, out, dirs_exist_ok=True)
    prompts = trainer.prompt_ids(run.tok, run.data.heldout_prompts)
    prog = trainer.Progress(report, steps, cfg.batch_size * cfg.seq_len)
    refined, acc = trainer.refine(run.model, cfg, run.streams(cfg), prompts[:cfg.eval_prompts],
                                  run.eos, prog, report)
    export_model(run.model, cfg.size, out, ids=run.ids)
    seconds = round(time.monotonic() - t0, 1)
    summary = {
        **run.summary,
        "config": {**asdict(cfg), "size": cfg.size.as_dict()},
        "default_steps": trainer.total_steps(trainer.TrainConfig()),
        "refine_final": refined, "acceptance_after_refine": acc,
        **trainer.final_evals(run.model, cfg, run.tok, prompts, run.data.heldout,
                              run.tool_heldout, run.eos, report),
        "train_seconds": round(run.summary["train_seconds"] + seconds, 1),
        "refined_separately": {"seconds": seconds, "torch_version": torch.__version__,
                               "python": platform.python_version(),
                               "machine": platform.machine(),
                               "phases_1_2_seconds": run.summary["train_seconds"]},
    }
    trainer.write_summary(out, summary, report)
    return summary
