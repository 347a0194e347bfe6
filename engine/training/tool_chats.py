"""Tool chats: the demo model learns to call the built-in ``python_doc`` and to answer from it.

With ``python_doc`` offered (the tools section the app writes into the system turn for a
template without tools, ``engine.server.templates``), a question about a standard-library
object is answered in two steps: the assistant calls ``python_doc(name)`` with the name copied
from the question, the tool's real result comes back in a ``<tool_response>`` turn, and the
assistant answers with the result's first line (the signature) and the docstring's first
paragraph, copied. Nothing is recalled: both steps copy, which a 5M-parameter model can learn
for names it never saw, where it cannot know their documentation.

Most names come from ``TOOL_MODULES``, modules the question/answer corpus does not cover; some
are the corpus's own (with tools offered the model calls the tool for those too: it does not
have to know what it knows). ``TOOL_HELDOUT`` names of the tool modules are in no chat: they
measure whether the model calls the tool for a name it never saw (``heldout_tool.json``).
The results are ``python_doc``'s own output, read in a fresh interpreter like the corpus items.
"""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

from engine.training import corpus

TOOL_MODULES: tuple[str, ...] = (
    "zipfile", "gzip", "bz2", "lzma", "tarfile", "calendar", "fractions", "decimal", "array",
    "queue", "sched", "pprint", "reprlib", "graphlib", "keyword", "numbers", "cmath", "codecs",
    "unicodedata", "locale", "getpass", "platform", "signal", "selectors", "mimetypes",
    "binascii", "quopri", "html.parser", "xml.dom.minidom", "xml.etree.ElementTree",
    "email.utils", "colorsys", "filecmp", "pickle", "shelve", "configparser", "tomllib",
    "netrc", "plistlib", "hmac", "getopt", "traceback", "warnings", "abc", "atexit", "inspect",
    "types", "weakref", "typing", "ast", "dis", "tokenize", "linecache", "timeit", "doctest",
    "ipaddress", "concurrent.futures", "zoneinfo", "wave", "socket", "select", "errno", "stat",
    "ftplib", "smtplib", "http.cookies", "urllib.request", "email.message", "cProfile",
    "pstats", "gc", "codeop", "pkgutil", "importlib", "sysconfig",
)
MAX_RESULT = 900  # characters of a result trained on (the training window is 256 tokens)
MAX_PARAGRAPH = 400
TOOL_HELDOUT = 32


@dataclass(frozen=True)
class ToolItem:
    """A name, ``python_doc``'s result for it, and the answer copied from that result."""

    name: str
    kind: str
    known: bool  # one of the question/answer corpus's objects
    result: str
    answer: str


def _answer(result: str) -> str:
    """The result's first line as code, then the docstring's first paragraph (its lines kept,
    cut at a sentence past ``MAX_PARAGRAPH``); "" when there is no usable paragraph."""
    head, _, doc = result.partition("\n\n")
    paras = [p.strip("\n") for p in re.split(r"\n\s*\n", doc) if p.strip()]
    short = head.split("(")[0].rsplit(".", 1)[-1]
    if paras and paras[0].replace(" ", "").startswith(short + "("):
        paras = paras[1:]  # a C function's docstring repeats its signature first
    if not paras or paras[0] == "(no docstring)":
        return ""
    para = paras[0]
    if len(para) > MAX_PARAGRAPH:
        cut = para[:MAX_PARAGRAPH].rsplit(". ", 1)[0]
        if len(cut) < 40:
            return ""
        para = cut + "."
    return f"`{head}`\n\n{para}" if len(para) >= 20 else ""


def collect_tool_items_here(modules: tuple[str, ...], known: tuple[str, ...]) -> list[ToolItem]:
    """:func:`collect_tool_items` in this process."""
    from engine.tools.python_doc import DocError, python_doc

    out: list[ToolItem] = []
    for group, is_known in ((modules, False), (known, True)):
        for item in corpus.collect_items_here(group):
            if item.kind == "method" and not is_known:
                continue
            try:
                result = python_doc(item.qualname)
            except DocError:
                continue
            if len(result) > MAX_RESULT or " at 0x" in result:
                continue  # too long to train on in a window; or not the same in two processes
            answer = _answer(result)
            if answer:
                out.append(ToolItem(item.qualname, item.kind, is_known, result, answer))
    return out


def collect_tool_items(modules: tuple[str, ...] = TOOL_MODULES,
                       known: tuple[str, ...] = corpus.MODULES, *,
                       limit: int | None = None) -> list[ToolItem]:
    """Every usable name of ``modules`` (and of the corpus's ``known`` modules), with
    ``python_doc``'s result, read in a fresh interpreter that imports only the standard
    library (the same reason as :func:`corpus.collect_items`); ``limit``: at most that many
    of each (the tiny configuration)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
    code = ("import json, sys; from dataclasses import asdict; "
            "from engine.training.tool_chats import collect_tool_items_here as c; "
            "m, k = json.loads(sys.argv[1]); "
            "json.dump([asdict(i) for i in c(tuple(m), tuple(k))], sys.stdout)")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([modules, known])], env=env,
                          cwd=root, capture_output=True, text=True, check=True)
    items = [ToolItem(**d) for d in json.loads(proc.stdout)]
    if limit is not None:
        items = ([i for i in items if not i.known][:limit]
                 + [i for i in items if i.known][:limit])
    return items


def synthetic_items(items: list[ToolItem], n: int, rng: random.Random,
                    avoid: set[str]) -> list[ToolItem]:
    """``n`` made-up names with made-up results: a real module, an attribute of word pieces
    from real names, parameters from real signatures and a real docstring paragraph of some
    other object. No two alike and none a real object, so the only way to write their call and
    answer is to copy them from the question and the result: what teaches the model to copy
    names and documentation it never saw, instead of reciting what it learnt."""
    modules = sorted({i.name.rsplit(".", 1)[0] for i in items if "." in i.name})
    words = sorted({w for i in items for w in re.split(r"[._]", i.name.rsplit(".", 1)[-1])
                    if w.isalpha() and 2 <= len(w) <= 12})
    params = sorted({p.strip().split("=")[0].strip("*/ ") for i in items
                     for p in i.result.split("\n", 1)[0].partition("(")[2].rstrip(")")
                     .split(",")} - {""})
    paras = sorted({i.answer.split("\n\n", 1)[1] for i in items})
    out: list[ToolItem] = []
    seen = set(avoid) | {i.name for i in items}
    while len(out) < n:
        attr = "_".join(rng.sample(words, rng.choice((1, 2, 2, 3))))
        if rng.random() < 0.2:
            attr = "".join(w.capitalize() for w in attr.split("_"))
        name = f"{rng.choice(modules)}.{attr}"
        if name in seen:
            continue
        seen.add(name)
        args = ", ".join(rng.sample(params, rng.choice((0, 1, 1, 2, 3))))
        head = f"{name}({args})"
        para = rng.choice(paras)
        out.append(ToolItem(name, "function", False, f"{head}\n\n{para}",
                            f"`{head}`\n\n{para}"))
    return out


def tools_system() -> str:
    """The system turn the app writes for the demo model with ``python_doc`` on."""
    from engine.server.templates import tools_section
    from engine.tools.python_doc import function_spec

    return tools_section([function_spec()])


def _questions(item: ToolItem) -> list[str]:
    doc_item = corpus.DocItem(item.name.rsplit(".", 1)[0], item.name, item.kind, "", "", "")
    return [q for q, _ in corpus.qa_templates(doc_item)]


def exchange(name: str, question: str, result: str, answer: str) -> list[dict]:
    """One round under the tools turn: the question, the call ``python_doc(name)``, the
    tool's result and the answer (what the tool chats train on and the agent bench replays)."""
    from engine.server.templates import tool_call_xml

    return [{"role": "user", "content": question},
            {"role": "assistant", "content": tool_call_xml("python_doc", {"name": name})},
            {"role": "user", "content": f"<tool_response>\n{result}\n</tool_response>"},
            {"role": "assistant", "content": answer}]


@dataclass(frozen=True)
class ToolChats:
    chats: list[list[dict]]
    heldout: list[dict]  # {"prompt", "name", "result", "answer"}: names in no chat


def build_tool_chats(items: list[ToolItem], *, seed: int, known_share: float = 0.2,
                     heldout: int = TOOL_HELDOUT, rounds: int = 1,
                     exchanges: tuple[int, ...] = (1, 2, 3, 4),
                     synthetic: int = 0) -> ToolChats:
    """Chats of ``exchanges`` question/call/result/answer rounds under the tools system turn
    (a fifth with the user's system prompt after it, as the app writes it). Half of them end
    at the last call (the model writes a call after the generation prompt's empty think
    block, as it does in the app); the others run to the answer. Every name of the tool
    modules is asked ``rounds`` times in different phrasings; the corpus's own names are a
    ``known_share`` of the questions; ``synthetic`` made-up names
    (:func:`synthetic_items`) are asked once each on top."""
    rng = random.Random(seed + 2)
    new = sorted((i for i in items if not i.known),
                 key=lambda i: zlib.crc32(f"{seed}/tool/{i.name}".encode()))
    held, new = new[:heldout], new[heldout:]
    known = [i for i in items if i.known]
    rng.shuffle(known)
    n_known = int(len(new) * rounds * known_share / (1 - known_share))
    asked = [(i, q) for i in new for q in rng.sample(_questions(i), rounds)]
    asked += [(i, rng.choice(_questions(i))) for i in known[:n_known]]
    if synthetic:
        made = synthetic_items(items, synthetic, random.Random(seed + 4),
                               avoid={i.name for i in held})
        asked += [(i, rng.choice(_questions(i))) for i in made]
    rng.shuffle(asked)
    system = tools_system()
    chats: list[list[dict]] = []
    k = 0
    while k < len(asked):
        n = rng.choice(exchanges)
        msgs: list[dict] = [{"role": "system", "content": system + (
            "\n\n" + rng.choice(corpus.SYSTEM_PROMPTS) if rng.random() < 0.2 else "")}]
        for item, question in asked[k:k + n]:
            msgs += exchange(item.name, question, item.result, item.answer)
        k += n
        if rng.random() < 0.5:
            msgs = msgs[:-2]  # ends at the last call
        chats.append(msgs)
    held_out = [{"prompt": rng.choice(_questions(i)), "name": i.name, "result": i.result,
                 "answer": i.answer} for i in held]
    return ToolChats(chats, held_out)


def _prompt(tok, messages: list[dict]) -> list[int]:
    from engine.training import tokenizer

    return tok.encode(tokenizer.render_chat(messages, add_generation_prompt=True,
                                            enable_thinking=False)).ids


def _text(tok, ids: list[int], eos: set[int]) -> str:
    return tok.decode([t for t in ids if t not in eos])


def _question(item: dict) -> list[dict]:
    return [{"role": "system", "content": tools_system()},
            {"role": "user", "content": item["prompt"]}]


def _call(item: dict) -> str:
    from engine.server.templates import tool_call_xml

    return tool_call_xml("python_doc", {"name": item["name"]})


def answer_prompt(tok, item: dict) -> list[int]:
    """The ids before the answer to held-out ``item``: its question, the right call and the
    tool's real result, under the app's ``# Tools`` system turn."""
    return _prompt(tok, _question(item) + [
        {"role": "assistant", "content": _call(item)},
        {"role": "user", "content": f"<tool_response>\n{item['result']}\n</tool_response>"}])


def evaluate(model, tok, heldout: list[dict], *, eos: set[int], max_new: int = 160,
             depth: int = 3) -> dict:
    """On names in no training chat, greedy: ``calls`` -- the share of questions answered with
    exactly ``python_doc(name)`` (the call the app's parser reads); ``answers`` -- after the
    real result, the share of answers that begin with the result's first line and
    ``exact`` -- that equal the trained answer form; ``acceptance`` and ``tokens_per_cycle``
    -- the MTP head's on those answers; ``examples``: the first two replies."""
    from engine.training import acceptance
    from engine.training.acceptance import greedy_generate

    got_calls = []
    for h in heldout:
        prompt = _prompt(tok, _question(h))
        got_calls.append(_text(tok, greedy_generate(model, prompt, max_new=48,
                                                    eos=eos)[len(prompt):], eos))
    acc = acceptance.measure(model, [answer_prompt(tok, h) for h in heldout], eos=eos,
                             depth=depth, max_new=max_new)
    got = [_text(tok, ids, eos) for ids in acc.pop("outputs")]
    n = max(1, len(heldout))
    calls = sum(c.strip() == _call(h) for c, h in zip(got_calls, heldout))
    answers = sum(g.startswith(h["answer"].split("\n")[0]) for g, h in zip(got, heldout))
    exact = sum(g.strip() == h["answer"] for g, h in zip(got, heldout))
    examples = [{"prompt": h["prompt"], "call": c, "answer": g}
                for h, c, g in list(zip(heldout, got_calls, got))[:2]]
    return {"prompts": len(heldout), "calls": round(calls / n, 3),
            "answers": round(answers / n, 3), "exact": round(exact / n, 3),
            "acceptance": acc["acceptance"], "tokens_per_cycle": acc["tokens_per_cycle"],
            "examples": examples}
