"""Rendering a model's chat template with a time and size budget.

A chat template is code from the model folder. transformers already renders it in Jinja's
``ImmutableSandboxedEnvironment`` (no file or attribute escapes), but the sandbox does not
bound work: nested loops run for ever and ``{{ 'a' * 10000000000 }}`` allocates 10 GB. Here
the same rendering runs in :class:`LimitedEnvironment`, a subclass of transformers' own
environment (same filters, globals and extensions, so output is byte-identical) that counts
every loop iteration and call against a step budget, checks a wall-clock deadline at each
step, refuses string/list products, powers, formats and filters whose result would exceed the
size cap *before* computing them, and caps the total output. Exceeding any of them raises
:class:`ChatTemplateError` ("this model's chat template did not finish (…)").

How: transformers' ``apply_chat_template`` compiles through
``transformers.utils.chat_template_utils._compile_jinja_template``; :func:`apply` swaps that
one function for the limited compiler while it runs (under a lock; the swap gives the same
output, so a concurrent caller elsewhere is unaffected) and sets the budget for this thread.
``tests/engine/models/test_chat_template.py`` fails loudly if transformers moves that function.
"""
from __future__ import annotations

import contextvars
import functools
import logging
import re
import threading
import time
from dataclasses import dataclass

from engine.errors import ChatTemplateError, GenerationError

log = logging.getLogger(__name__)

_ITER = "_mtpchat_counted"
_CONCAT = "_mtpchat_concat"
_DIGITS = re.compile(r"\d{8,}")
_SIZED_STR_METHODS = {"center", "ljust", "rjust", "zfill"}


@dataclass(frozen=True)
class Limits:
    """A render's budget: seconds, loop iterations + calls, characters of any value/output."""

    time_s: float = 10.0
    steps: int = 2_000_000
    chars: int = 32 * 2**20
    source_chars: int = 2 * 2**20


DEFAULT_LIMITS = Limits()


class _Budget:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.time_s
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.limits.steps:
            raise ChatTemplateError(_unfinished(f"more than {self.limits.steps:,} loop "
                                                "iterations and calls"))
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(_unfinished(f"still running after {self.limits.time_s:g} s"))

    def size(self, n: int, what: str = "a value") -> None:
        if n > self.limits.chars:
            raise ChatTemplateError(_unfinished(f"{what} of {n:,} characters, over the "
                                                f"{self.limits.chars:,} limit"))


def _unfinished(why: str) -> str:
    return f"This model's chat template did not finish ({why}). Use a raw prompt, or fix the template."


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("chat_budget",
                                                                         default=None)


def _budget() -> _Budget | None:
    return _BUDGET.get()


def _length(x) -> int:
    return len(x) if isinstance(x, (str, bytes, list, tuple, dict)) else 0


def _check_result(x):
    b = _budget()
    if b is not None:
        b.size(_length(x))
    return x


def _counted(iterable):
    """Every ``{% for %}`` iterates through this (see LimitedEnvironment._parse)."""
    b = _budget()
    for item in iterable:
        if b is not None:
            b.step()
        yield item


def _concat(*parts) -> str:
    """``a ~ b ~ c`` (see LimitedEnvironment._parse): sized before joining."""
    texts = [str(p) for p in parts]
    b = _budget()
    if b is not None:
        b.step()
        b.size(sum(len(t) for t in texts), "a concatenation")
    return "".join(texts)


def _join_output(pieces) -> str:
    """The environment's ``concat``: the rendered output (and every macro's), capped."""
    b = _budget()
    out, n = [], 0
    for piece in pieces:
        n += len(piece)
        if b is not None:
            b.size(n, "the rendered text")
        out.append(piece)
    return "".join(out)


def _limited_filter(name: str, fn):
    @functools.wraps(fn)  # keeps jinja's pass_context / pass_environment markers
    def wrapper(*args, **kwargs):
        b = _budget()
        if b is not None:
            b.step()
            _precheck(name, b, [a for a in args if not _is_jinja_internal(a)], kwargs)
        return _check_result(fn(*args, **kwargs))
    return wrapper


def _is_jinja_internal(x) -> bool:
    from jinja2.environment import Environment
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    return isinstance(x, (Context, Environment, EvalContext))


def _precheck(name: str, b: _Budget, args: list, kwargs: dict) -> None:
    """Refuse an operation whose result would be over the size cap, before computing it."""
    values = list(args) + list(kwargs.values())
    if name in ("center", "indent", "ljust", "rjust", "zfill", "expandtabs"):
        for v in values[1:]:
            if isinstance(v, int) and not isinstance(v, bool):
                b.size(abs(v) * (max(_length(values[0]), 1) if name in ("indent", "expandtabs")
                                 else 1), f"a {name}() result")
    elif name in ("format", "format_map", "%") and values and isinstance(values[0], str):
        if _DIGITS.search(values[0]):
            b.size(b.limits.chars + 1, "a formatted string")
        if "*" in values[0]:
            for v in values[1:] if name != "%" else _flat(values[1:]):
                if isinstance(v, int) and not isinstance(v, bool):
                    b.size(abs(v), "a formatted string")
    elif name == "replace" and len(values) >= 3 and all(isinstance(v, str) for v in values[:3]):
        s, old, new = values[:3]
        hits = len(s) + 1 if old == "" else s.count(old)
        b.size(len(s) + hits * max(len(new) - len(old), 0), "a replace() result")


def _flat(values: list) -> list:
    out = []
    for v in values:
        out.extend(v if isinstance(v, (tuple, list)) else [v])
    return out


def _make_environment_class():
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class LimitedEnvironment(ImmutableSandboxedEnvironment):
        """transformers' sandbox with a step, time and size budget (see the module doc)."""

        intercepted_binops = frozenset({"*", "**", "+", "%"})
        concat = staticmethod(_join_output)

        def _parse(self, source, name, filename):
            """Route every loop's iterable through ``_counted`` and every ``~`` through
            ``_concat`` (the sandbox has no hook for either)."""
            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(nodes.For):
                loop.iter = nodes.Call(nodes.Name(_ITER, "load"), [loop.iter], [], None, None,
                                       lineno=loop.lineno)
            for parent in tree.find_all(nodes.Node):
                for field in parent.fields:
                    value = getattr(parent, field, None)
                    if isinstance(value, nodes.Concat):
                        setattr(parent, field, _concat_call(value))
                    elif isinstance(value, list):
                        setattr(parent, field, [_concat_call(v) if isinstance(v, nodes.Concat)
                                                else v for v in value])
            return tree

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's signature
            b = _budget()
            if b is not None:
                b.step()
                name = getattr(__obj, "__name__", "")
                if isinstance(getattr(__obj, "__self__", None), str) and (
                        name in _SIZED_STR_METHODS or name in ("replace", "format",
                                                               "format_map", "expandtabs")):
                    _precheck(name, b, [__obj.__self__, *args], kwargs)
            return _check_result(super().call(__context, __obj, *args, **kwargs))

        def call_binop(self, context, operator, left, right):
            b = _budget()
            if b is not None:
                b.step()
                _binop_precheck(b, operator, left, right)
            return _check_result(super().call_binop(context, operator, left, right))

    return LimitedEnvironment


def _concat_call(node):
    from jinja2 import nodes

    return nodes.Call(nodes.Name(_CONCAT, "load"), list(node.nodes), [], None, None,
                      lineno=node.lineno)


def _binop_precheck(b: _Budget, op: str, left, right) -> None:
    def is_int(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if op == "*":
        seq, n = (left, right) if is_int(right) else (right, left)
        if is_int(n) and _length(seq):
            b.size(_length(seq) * max(n, 0), "a repeated string or list")
    elif op == "**" and is_int(left) and is_int(right):
        if abs(left) > 1 and right > 0 and right * max(abs(left).bit_length(), 1) > 100_000:
            raise ChatTemplateError(_unfinished(f"{left} ** {right} is too large to compute"))
    elif op == "+" and _length(left) and _length(right):
        b.size(_length(left) + _length(right), "a concatenation")
    elif op == "%" and isinstance(left, str):
        _precheck("%", b, [left, right], {})


@functools.lru_cache(maxsize=16)
def _compile_limited(source: str, original):
    """``source`` compiled in a LimitedEnvironment configured like transformers' own.

    transformers' environment is read from an empty template: compiling ``source`` there
    would constant-fold (and so compute) ``{{ 'a' * 10**10 }}`` before any check.
    """
    base = original("").environment
    env = _make_environment_class()(
        trim_blocks=base.trim_blocks, lstrip_blocks=base.lstrip_blocks,
        keep_trailing_newline=base.keep_trailing_newline, autoescape=base.autoescape,
        undefined=base.undefined, finalize=base.finalize,
        extensions=[type(ext) for ext in base.extensions.values()])
    env.filters.update({k: _limited_filter(k, f) for k, f in base.filters.items()})
    env.globals.update(base.globals)
    env.globals[_ITER] = _counted
    env.globals[_CONCAT] = _concat
    return env.from_string(source)


_PATCH_LOCK = threading.RLock()


def apply(tokenizer, messages: list[dict], *, limits: Limits = DEFAULT_LIMITS, **kwargs):
    """``tokenizer.apply_chat_template(messages, **kwargs)`` within ``limits``."""
    import jinja2
    from transformers.utils import chat_template_utils as ctu

    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise GenerationError("This model has no chat template; use a raw prompt instead.")
    if isinstance(template, str) and len(template) > limits.source_chars:
        raise ChatTemplateError(_unfinished(f"the template is {len(template):,} characters"))
    with _PATCH_LOCK:
        original = ctu._compile_jinja_template
        ctu._compile_jinja_template = lambda src: _compile_limited(src, original)
        token = _BUDGET.set(_Budget(limits))
        try:
            return tokenizer.apply_chat_template(messages, **kwargs)
        except ChatTemplateError:
            raise
        except RecursionError:
            raise ChatTemplateError(_unfinished("recursion too deep")) from None
        except MemoryError:
            raise ChatTemplateError(_unfinished("out of memory")) from None
        except (jinja2.TemplateError, ValueError, TypeError, KeyError, IndexError,
                AttributeError, ZeroDivisionError, OverflowError) as exc:
            raise GenerationError(f"This model's chat template failed: {exc}") from exc
        finally:
            _BUDGET.reset(token)
            ctu._compile_jinja_template = original


def chat_ids(tokenizer, messages: list[dict], *, enable_thinking: bool | None = None,
             supports_thinking: bool = True, add_generation_prompt: bool = True,
             tools: list[dict] | None = None, limits: Limits = DEFAULT_LIMITS,
             max_tokens: int | None = None, context: int | None = None) -> list[int]:
    """Token ids of ``messages`` rendered by the model's chat template (within ``limits``).

    The text is rendered, then tokenized as ``apply_chat_template(tokenize=True)`` does
    (no special tokens added) but in bounded memory: with ``max_tokens`` a longer prompt
    raises ``PromptTooLongError`` before it is tokenized whole
    (``engine.models.prompt_limits.encode_bounded``; ``context`` words the error)."""
    from engine.models.prompt_limits import encode_bounded

    kwargs: dict = {}
    if enable_thinking is not None and supports_thinking:
        kwargs["enable_thinking"] = enable_thinking
    if tools is not None:
        kwargs["tools"] = tools
    text = apply(tokenizer, messages, limits=limits, add_generation_prompt=add_generation_prompt,
                 tokenize=False, **kwargs)
    if not isinstance(text, str):
        raise GenerationError("This model's chat template did not render text.")
    return encode_bounded(tokenizer, text, limit=max_tokens, context=context)
