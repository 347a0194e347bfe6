"""Question/answer chats built from the Python standard library's own docstrings.

The text comes from the docstrings of the running interpreter's standard library (Python
Software Foundation License, redistributable), read with ``inspect`` -- nothing is downloaded.
The corpus is deterministic given the seed and the Python version. Every item (function, class,
method, module) is asked about in several phrasings; one phrasing per item is held out, so the
held-out prompts are questions the model never saw about things it knows.
"""
from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import random
import re
import subprocess
import sys
import warnings
import zlib
from dataclasses import asdict, dataclass  # noqa: F401 - asdict is used through this module by the corpus subprocess
from pathlib import Path

log = logging.getLogger(__name__)

# The most used modules of the standard library: a corpus a 5M-parameter model can learn well
# enough to answer correctly (a broader one, 121 modules, left it answering in the right form
# with the wrong content).
MODULES: tuple[str, ...] = (
    "builtins", "os.path", "json", "math", "random", "re", "string", "itertools", "functools",
    "collections", "datetime", "time", "shutil", "pathlib", "statistics", "heapq", "bisect",
    "copy", "csv", "glob", "fnmatch", "textwrap", "base64", "hashlib", "uuid", "os", "sys",
    "subprocess", "tempfile", "zlib", "operator", "secrets", "difflib", "shlex",
    "urllib.parse", "html", "dataclasses", "enum", "contextlib", "io", "struct", "logging",
    "argparse", "sqlite3", "threading",
)

# Methods are asked about only for these classes (the everyday ones).
METHOD_CLASSES: frozenset[str] = frozenset({
    "str", "list", "dict", "set", "pathlib.Path", "datetime.datetime", "datetime.date",
    "collections.deque", "collections.Counter", "re.Pattern", "re.Match",
})

SYSTEM_PROMPTS: tuple[str, ...] = (
    "You are a helpful assistant.",
    "You are a helpful assistant that answers questions about the Python standard library.",
    "Answer briefly and precisely.",
)

# Modules whose public functions live in an implementation module of another name.
OWNER_ALIASES: dict[str, tuple[str, ...]] = {
    "os": ("posix", "nt"), "os.path": ("posixpath", "genericpath", "ntpath"),
    "time": ("time",), "select": ("select",),
}

MAX_SIGNATURE = 90
MAX_ANSWER = 360


@dataclass(frozen=True)
class DocItem:
    """One documented object: ``qualname`` like ``json.dumps`` or ``str.join``."""

    module: str
    qualname: str
    kind: str  # "function", "class", "method", "module"
    signature: str  # "(obj, *, skipkeys=False)" or ""
    text: str  # one or two unwrapped docstring paragraphs
    first_sentence: str


def _paragraphs(doc: str) -> list[str]:
    paras = [" ".join(line.strip() for line in p.splitlines()).strip()
             for p in re.split(r"\n\s*\n", inspect.cleandoc(doc))]
    return [p for p in paras if p]


def _signature(obj) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    # Default values that print their address (sentinels) differ per process: drop the address.
    sig = re.sub(r" at 0x[0-9a-fA-F]+", "", sig)
    return sig if len(sig) <= MAX_SIGNATURE else ""


def _answer_text(paras: list[str], signature_line: str) -> str:
    """The first paragraph (skipping a leading ``name(args)`` line), plus the next if short."""
    if paras and signature_line and paras[0].replace(" ", "").startswith(signature_line):
        paras = paras[1:]
    if not paras:
        return ""
    text = paras[0]
    if len(text) < 160 and len(paras) > 1 and len(text) + len(paras[1]) < MAX_ANSWER:
        text = text + "\n\n" + paras[1]
    if len(text) > MAX_ANSWER:
        cut = text[:MAX_ANSWER].rsplit(". ", 1)[0]
        text = cut + "." if len(cut) > 80 else text[:MAX_ANSWER].rsplit(" ", 1)[0] + " ..."
    return text


def _first_sentence(text: str) -> str:
    m = re.match(r"(.+?[.!?])(\s|$)", text.replace("\n\n", " "))
    return m.group(1) if m else text.split("\n")[0]


def _make_item(module: str, qualname: str, kind: str, obj) -> DocItem | None:
    doc = obj.__doc__
    if not isinstance(doc, str) or len(doc.strip()) < 20:
        return None
    sig = _signature(obj) if kind in ("function", "class", "method") else ""
    short = qualname.rsplit(".", 1)[-1]
    text = _answer_text(_paragraphs(doc), short + "(")
    if len(text) < 20 or "\x00" in text:
        return None
    return DocItem(module, qualname, kind, sig, text, _first_sentence(text))


def _members(mod_name: str, mod) -> list[DocItem]:
    items: list[DocItem] = []
    module_item = _make_item(mod_name, mod_name, "module", mod)
    if module_item:
        items.append(module_item)
    prefix = "" if mod_name == "builtins" else mod_name + "."
    for name in sorted(vars(mod)):
        if name.startswith("_"):
            continue
        obj = vars(mod)[name]
        owner = getattr(obj, "__module__", None)
        owners = (mod_name, "_" + mod_name.split(".")[-1], *OWNER_ALIASES.get(mod_name, ()))
        if owner not in owners and mod_name != "builtins":
            continue
        if inspect.isclass(obj):
            if mod_name == "builtins" and issubclass(obj, BaseException):
                continue
            cls_item = _make_item(mod_name, prefix + name, "class", obj)
            if cls_item:
                items.append(cls_item)
            for meth_name in sorted(vars(obj)) if prefix + name in METHOD_CLASSES else ():
                meth = vars(obj)[meth_name]
                if meth_name.startswith("_") or not callable(meth):
                    continue
                item = _make_item(mod_name, f"{prefix}{name}.{meth_name}", "method", meth)
                if item:
                    items.append(item)
        elif inspect.isroutine(obj):
            item = _make_item(mod_name, prefix + name, "function", obj)
            if item:
                items.append(item)
    return items


def collect_items(modules: tuple[str, ...] = MODULES) -> list[DocItem]:
    """Every documented public object of ``modules``, read in a fresh interpreter.

    Libraries patch the standard library when imported (transformers adds methods to
    ``logging.Logger``, torch replaces ``inspect.getfile``), so the items are collected in a
    subprocess that imports nothing but the standard library: the corpus does not depend on
    what the calling process imported.
    """
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
    code = ("import json, sys; from engine.training.corpus import collect_items_here, asdict; "
            "json.dump([asdict(i) for i in collect_items_here(tuple(sys.argv[1:]))], sys.stdout)")
    proc = subprocess.run([sys.executable, "-c", code, *modules], env=env, cwd=root,
                          capture_output=True, text=True, check=True)
    return [DocItem(**d) for d in json.loads(proc.stdout)]


def collect_items_here(modules: tuple[str, ...] = MODULES) -> list[DocItem]:
    """:func:`collect_items` in this process (its result depends on what is imported)."""
    seen: set[str] = set()
    items: list[DocItem] = []
    for mod_name in modules:
        # Deprecated names (typing.io ...) warn on attribute access: read them all the same.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                mod = importlib.import_module(mod_name)
            except ImportError as exc:  # optional modules (e.g. no _ssl): skip
                log.info("skipping %s: %s", mod_name, exc)
                continue
            members = _members(mod_name, mod)
        for item in members:
            if item.qualname not in seen:
                seen.add(item.qualname)
                items.append(item)
    return items


# --- questions and answers ---------------------------------------------------------------------

def qa_templates(item: DocItem) -> list[tuple[str, str]]:
    q, sig, mod, text = item.qualname, item.signature, item.module, item.text
    if item.kind == "module":
        return [
            (f"What is the `{q}` module for?", f"The `{q}` module: {text}"),
            (f"Tell me about the {q} module.", text),
            (f"What does `import {q}` give me?", f"`{q}` -- {text}"),
            (f"What is in the {q} module?", f"The `{q}` module. {text}"),
        ]
    call = f"`{q}{sig}`"
    what = "class" if item.kind == "class" else "method" if item.kind == "method" else "function"
    pairs = [
        (f"What does `{q}` do?", f"{call}\n\n{text}"),
        (f"Explain {q}.", f"{call} is a {what} in the `{mod}` module.\n\n{text}"),
        (f"How do I use {q}?", f"Use {call}. {text}"),
        (f"Tell me about `{q}` in Python.", f"{text}\n\nSignature: {call}" if sig else text),
        (f"What is {q} for?", f"{call}: {text}"),
        (f"Can you describe `{q}`?", f"Sure. {call} -- {text}"),
    ]
    if sig:
        pairs.append((f"What is the signature of {q}?", f"{call}\n\n{item.first_sentence}"))
    if item.kind == "class":
        pairs.append((f"What is `{q}`?", f"{call} is a class from `{mod}`. {text}"))
    return pairs


def heldout_index(item: DocItem, n_templates: int, seed: int) -> int:
    """Which of an item's question templates is never trained on (fixed by seed and name)."""
    return zlib.crc32(f"{seed}:{item.qualname}".encode()) % n_templates


@dataclass(frozen=True)
class Corpus:
    """Training conversations and held-out user prompts.

    Every documented object is trained on, but one of its question phrasings (and the answer
    in that phrasing's form) is held out: ``heldout`` lists those questions with the object and
    the first sentence a correct answer contains. The model has to put together what it learnt
    about the object from other phrasings with the answer form it learnt from other objects.
    """

    train_chats: list[list[dict]]
    heldout: list[dict]
    n_items: int

    @property
    def heldout_prompts(self) -> list[str]:
        return [h["prompt"] for h in self.heldout]


def build_corpus(*, seed: int = 0, variants: int = 6, max_heldout_prompts: int = 64,
                 limit_items: int | None = None) -> Corpus:
    """Deterministic chats: every item asked up to ``variants`` of its trained phrasings,
    1-3 turns per chat (grouped by module), a quarter with a system prompt."""
    items = collect_items()
    if limit_items is not None:
        items = items[:limit_items]
    rng = random.Random(seed + 1)
    turns: list[tuple[str, tuple[str, str]]] = []
    heldout: list[dict] = []
    for item in items:
        pairs = qa_templates(item)
        held = heldout_index(item, len(pairs), seed)
        trained = [qa for i, qa in enumerate(pairs) if i != held]
        for qa in rng.sample(trained, min(variants, len(trained))):
            turns.append((item.module, qa))
        heldout.append({"prompt": pairs[held][0], "answer": pairs[held][1],
                        "qualname": item.qualname, "first_sentence": item.first_sentence})
    rng.shuffle(turns)
    turns.sort(key=lambda t: t[0])  # group by module (stable: shuffled within a module)
    chats: list[list[dict]] = []
    i = 0
    while i < len(turns):
        n = rng.choice((1, 1, 2, 3))
        chunk = [qa for mod, qa in turns[i:i + n] if mod == turns[i][0]]
        i += len(chunk)
        msgs: list[dict] = []
        if rng.random() < 0.25:
            msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        for question, answer in chunk:
            msgs += [{"role": "user", "content": question},
                     {"role": "assistant", "content": answer}]
        chats.append(msgs)
    rng.shuffle(chats)
    heldout.sort(key=lambda h: zlib.crc32(f"{seed}/{h['qualname']}".encode()))
    return Corpus(chats, heldout[:max_heldout_prompts], len(items))
