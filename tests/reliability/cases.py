"""The CLI cases: one bad input each, the exit code expected and words the message must hold.

``base`` is the tiny model a case's folder is copied from ("tiny": one shard, "sharded": an
index and two shards; None: no folder), ``edit`` breaks the copy (``tests.reliability.broken``),
``args`` is the command line with ``{m}`` for the folder and ``{tmp}`` for a scratch folder.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tests.reliability import broken as b

RM_BUSY = "acme--busy"              # a download of this name holds its lock during the batch
INSTALLED = {"acme--x": "acme/x", RM_BUSY: "acme/busy", "acme--gone": "acme/gone"}  # store name -> repo id pulled from
GEN = ["--prompt-ids", "5,6,7", "--max-tokens", "1", "--depth", "0"]
CHAT = ["--chat", "--prompt", "hi", "--max-tokens", "1", "--depth", "0"]
NESTED_LOOPS = ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}"
                "{% endfor %}")


@dataclass(frozen=True)
class Case:
    cls: str
    id: str
    args: tuple[str, ...]
    rc: int
    words: tuple[str, ...] = ()
    base: str | None = "tiny"
    edit: object = None

    def argv(self, folder: Path | None, tmp: Path) -> list[str]:
        return [a.replace("{m}", str(folder)).replace("{tmp}", str(tmp)) for a in self.args]


def gen(cls, id_, edit, *words, base="tiny", rc=2):
    return Case(cls, id_, ("generate", "--model", "{m}", *GEN), rc, words, base, edit)


def insp(cls, id_, edit, *words, base="tiny"):
    """inspect answers supported: false (exit 1) and names the reason."""
    return Case(cls, id_, ("inspect", "{m}", "--json"), 1, words, base, edit)


def chat(id_, template, *words):
    return Case("chat template", id_, ("generate", "--model", "{m}", *CHAT), 2, words, "tiny",
                b.chat_template(template))


LOAD = [
    gen("load", "heads-0", b.set_text(num_attention_heads=0), "num_attention_heads"),
    gen("load", "hidden-0", b.set_text(hidden_size=0), "hidden_size"),
    gen("load", "hidden-negative", b.set_text(hidden_size=-64), "hidden_size"),
    gen("load", "vocab-1e12", b.set_text(vocab_size=10**12), "vocab_size"),
    gen("load", "quantization-4", b.set_top(quantization=4), "quantization"),
    gen("load", "quantization-bits-7", b.set_top(quantization={"bits": 7}), "bits"),
    gen("load", "quantization-group-0", b.set_top(quantization={"bits": 4, "group_size": 0}),
        "group_size"),
    gen("load", "weight-map-not-string", b.index_entry(5), "weight_map", base="sharded"),
    gen("load", "header-json-list", b.header_list, "model.safetensors", "object"),
    gen("load", "header-deeply-nested", b.header_nested, "model.safetensors", "nested"),
    gen("load", "layers-string", b.set_text(num_hidden_layers="4"), "num_hidden_layers"),
    gen("load", "kv-heads-not-dividing", b.set_text(num_key_value_heads=3),
        "num_key_value_heads"),
    gen("load", "rms-eps-string", b.set_text(rms_norm_eps="x"), "rms_norm_eps"),
    gen("load", "mtp-layers-negative", b.set_text(mtp_num_hidden_layers=-1),
        "mtp_num_hidden_layers"),
    gen("load", "text-config-list", b.set_top(text_config=[1]), "text_config"),
    gen("load", "architectures-string", b.set_top(architectures="Qwen"), "architectures"),
    gen("load", "head-dim-mismatch", b.set_text(head_dim=8), "do not match"),
    gen("load", "config-before-tokenizer", b.both(b.set_text(num_attention_heads=0),
                                                  b.remove("tokenizer.json")),
        "num_attention_heads"),
]

INSPECT = [
    insp("inspect", "truncated-shard", b.truncate_shard, "truncated"),
    insp("inspect", "missing-tensor", b.drop_tensor, "missing", "down_proj"),
    insp("inspect", "wrong-shape-tensor", b.wrong_shape, "shape", "down_proj"),
    insp("inspect", "inspect-heads-0", b.set_text(num_attention_heads=0), "num_attention_heads"),
    insp("inspect", "unknown-architecture", b.set_top(
        architectures=["Qwen3_5ForTokenClassification"]), "Qwen3_5ForTokenClassification"),
    insp("inspect", "unknown-dtype", b.edit_header(lambda h: h[sorted(
        k for k in h if k != "__metadata__")[0]].update(dtype="F4")), "dtype"),
    insp("inspect", "index-missing-shard", b.remove("model-00002-of-00002.safetensors"),
         "missing shard", base="sharded"),
    insp("inspect", "inspect-header-json-list", b.header_list, "object"),
    insp("inspect", "shard-is-dev-zero", b.shard_to_dev_zero, "/dev/zero", "refused"),
    insp("inspect", "inspect-vocab-1e12", b.set_text(vocab_size=10**12), "vocab_size"),
    # what inspect refuses, generate refuses too (and the other way round)
    gen("inspect", "agree-truncated", b.truncate_shard, "truncated"),
    gen("inspect", "agree-missing-tensor", b.drop_tensor, "missing", "down_proj"),
    gen("inspect", "agree-wrong-shape", b.wrong_shape, "down_proj"),
    gen("inspect", "agree-unknown-architecture", b.set_top(
        architectures=["Qwen3_5ForTokenClassification"]), "Qwen3_5ForTokenClassification"),
]

PATHS = [
    gen("paths", "index-dotdot", b.index_dotdot_to_a_real_shard, "outside the model folder",
        base="sharded"),
    gen("paths", "index-absolute", b.index_entry("/etc/passwd"), "outside the model folder",
        base="sharded"),
    gen("paths", "index-symlink-outside", b.index_symlink_outside, "outside the model folder",
        base="sharded"),
    insp("paths", "inspect-index-dotdot", b.index_dotdot_to_a_real_shard,
         "outside the model folder", base="sharded"),
    Case("paths", "convert-group-size-0", ("convert", "{m}", "{tmp}/c0", "--bits", "4",
                                           "--group-size", "0"), 2, ("--group-size",)),
    Case("paths", "convert-group-size-negative", ("convert", "{m}", "{tmp}/c1", "--bits", "4",
                                                  "--group-size", "-1"), 2, ("--group-size",)),
    Case("paths", "convert-bits-3", ("convert", "{m}", "{tmp}/c2", "--bits", "3"), 2,
         ("--bits",)),
    Case("paths", "pull-group-size-0", ("pull", "acme/never", "--convert", "--group-size",
                                        "0"), 2, ("--group-size",), base=None),
    Case("paths", "convert-keeps-foreign-staging", ("convert", "{m}", "{m}-out"), 0, (),
         edit=b.foreign_converting_folder),
]

NAMES = [
    Case("names", "generate-by-repo-id", ("generate", "--model", "acme/x", *GEN), 0,
         base=None),
    Case("names", "generate-by-installed-name", ("generate", "--model", "acme--x", *GEN), 0,
         base=None),
    Case("names", "generate-unknown-name", ("generate", "--model", "nobody/nothing", *GEN), 2,
         ("not found", "nobody/nothing"), base=None),
    Case("names", "inspect-by-installed-name", ("inspect", "acme--x", "--json"), 0, base=None),
    Case("names", "rm-by-repo-id", ("rm", "acme/gone", "--yes"), 0, ("deleted acme--gone",),
         base=None),
    Case("names", "inspect-unknown-name", ("inspect", "not a repo!"), 2,
         ("not a Hugging Face model id",), base=None),
]

STORE = [
    Case("store", "rm-while-downloading", ("rm", RM_BUSY, "--yes"), 2,
         ("being downloaded",), base=None),
    Case("store", "pull-unsupported-architecture", ("pull", "tiny/llama"), 2,
         ("cannot be used", "llama", "nothing was installed"), base=None),
    Case("store", "pull-wrong-shape-weights", ("pull", "broken/shape"), 2,
         ("cannot be used", "down_proj"), base=None),
    Case("store", "pull-heads-0", ("pull", "broken/heads"), 2,
         ("cannot be used", "num_attention_heads"), base=None),
    Case("store", "list-after-refused-pulls", ("list", "--json"), 0, (), base=None),
]

TEMPLATES = [
    chat("nested-loops", NESTED_LOOPS, "chat template did not finish", "iterations"),
    chat("huge-string", "{{ 'a' * 10000000000 }}", "chat template did not finish"),
    chat("huge-center", "{{ 'a'|center(10000000000) }}", "chat template did not finish"),
    chat("huge-power", "{{ 10 ** 100000000 }}", "chat template did not finish"),
    chat("doubling-concat", "{% set ns = namespace(s='a') %}{% for i in range(64) %}"
         "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}", "chat template did not finish"),
    chat("recursive-macro", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
         "chat template did not finish"),
    chat("raises", "{{ raise_exception('no system role here') }}", "chat template",
         "no system role here"),
    chat("syntax-error", "{% for %}", "chat template"),
]

CLI = [
    Case("cli", "prompt-ids-not-int", ("generate", "--model", "{m}", "--prompt-ids", "1,x"), 2,
         ("comma-separated integers", "1,x")),
    Case("cli", "depth-word", ("generate", "--model", "{m}", "--prompt-ids", "1", "--depth",
                               "deep"), 2, ("--depth",)),
    Case("cli", "serve-port-out-of-range", ("serve", "--port", "99999"), 2, ("--port", "65535"),
         base=None),
    Case("cli", "serve-max-streams-zero", ("serve", "--max-streams", "0"), 2,
         ("--max-streams", "1 to 64"), base=None),
    Case("cli", "serve-memory-budget-negative", ("serve", "--memory-budget", "-3"), 2,
         ("--memory-budget", "more than 0"), base=None),
    Case("cli", "bench-streams-not-a-number", ("bench", "--streams", "1,x"), 2,
         ("--streams", "number of streams", "'x'"), base=None),
    Case("cli", "bench-reopen-negative", ("bench", "--reopen", "-1"), 2, ("--reopen",),
         base=None),
    Case("cli", "bench-context-not-a-number", ("bench", "--context", "512,x"), 2,
         ("--context", "'x'"), base=None),
    Case("cli", "bench-repeats-zero", ("bench", "--repeats", "0"), 2,
         ("--repeats", ">= 1", "'0'"), base=None),
    Case("cli", "rm-unknown", ("rm", "nothing-here", "--yes"), 2, ("no model named",),
         base=None),
    Case("cli", "unknown-verb", ("frobnicate",), 2, ("invalid choice",), base=None),
]



def prompts_file(text: str | None = None, *, kind: str = "file"):
    """An edit that puts ``p.json`` in the case's folder: ``text``, a FIFO, a folder, Latin-1
    bytes, or nothing."""
    def edit(folder: Path) -> None:
        path = folder / "p.json"
        if kind == "fifo":
            os.mkfifo(path)  # opening it would block until a writer came: never
        elif kind == "dir":
            path.mkdir()
        elif kind == "latin1":
            path.write_bytes(b'["caf\xe9"]')
        elif text is not None:
            path.write_text(text)
    return edit


def bench_prompts(id_, edit, *words):
    """``bench --prompts FILE`` refuses a bad FILE in one line naming it: no fallback to the
    built-in prompts, no traceback, before the model is loaded."""
    return Case("bench prompts", id_, ("bench", "--prompts", "{m}/p.json", "--max-tokens", "1",
                                       "--repeats", "1", "--depths", "0", "--no-mlx-lm"),
                2, ("p.json", *words), "tiny", edit)


BENCH_PROMPTS = [
    bench_prompts("number", prompts_file("5"), "a number (5)", "list of prompts"),
    bench_prompts("object-of-number", prompts_file('{"a": 5}'), "class 'a'", "a number (5)"),
    bench_prompts("empty-list", prompts_file("[]"), "no prompts"),
    bench_prompts("class-with-empty-list", prompts_file('{"a": []}'), "class 'a'", "no prompts"),
    bench_prompts("empty-object", prompts_file("{}"), "no prompt classes"),
    bench_prompts("prompt-not-a-string", prompts_file('["hi", 5]'), "prompt 2",
                  "not a non-empty string"),
    bench_prompts("malformed-json", prompts_file('{"a": [}'), "not valid JSON", "line 1"),
    bench_prompts("not-utf8", prompts_file(kind="latin1"), "not UTF-8"),
    bench_prompts("missing", prompts_file(None, kind="none"), "No such file"),
    bench_prompts("folder", prompts_file(kind="dir"), "a folder"),
    bench_prompts("fifo", prompts_file(kind="fifo"), "not a regular file"),
]

CASES = LOAD + INSPECT + PATHS + NAMES + STORE + TEMPLATES + CLI + BENCH_PROMPTS
assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"
