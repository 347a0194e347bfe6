"""What a request constrains its reply to, as a grammar every drawn token must follow
(``engine.sampling.grammar``): structured output, and a forced tool call.

Contract:
- ``constraint_of(backend, body, key)``: the request's structured output (``body[key]``: an
  OpenAI ``response_format``, or ``{type: json_schema, schema}`` as Anthropic and the Responses
  API write it) as a ``Constraint`` built for one reply; None for plain text.
- ``forced_call_grammar(tools, name, parallel=)``: the grammar of a reply that is a tool call
  and nothing else (``tool_choice: "required"`` or a named function, Anthropic's ``any`` /
  ``tool``): ``<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>``, the Qwen3
  JSON form ``engine.server.toolcalls`` parses, with the arguments valid against the tool's
  parameter schema (no undeclared top-level arguments unless the schema allows them with
  ``additionalProperties``); one call, or several separated by a newline when ``parallel``.
  ``forced_constraint(backend, tools, name, parallel=, param=)`` builds it for one reply.
- Each is compiled on a worker thread (never the event loop or the decoding thread) within
  ``COMPILE_S``; one that cannot be compiled, is over the grammar module's size limits or
  admits no document is a 400 naming ``key`` / ``param``. The decoding thread then only uses
  the built constraint (``GenRequest.response_format``).
- ``ToolUse``: a request's tools, whether a call is forced (and of which tool), and how many
  calls a reply may report (``parallel_tool_calls: false``: one); ``max_calls_of`` reads the
  parallel switch.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import GenerationError
from engine.sampling import grammar
from engine.server.common import Backend
from engine.server.errors import ApiError, bad_request

COMPILE_S = 10.0  # the most a grammar may take to compile (it runs off the loop meanwhile)
# The JSON layout the model's own calls use (one space after ':' and ','), as compile_format does.
_LAYOUT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


async def build_constraint(backend: Backend, compile_text: Callable[[], str | None],
                           param: str) -> grammar.Constraint | None:
    """``compile_text()`` (on a worker thread) -> llguidance grammar text -> a ``Constraint``
    for this model; errors are a 400 naming ``param``."""
    info = backend.info
    try:
        async with asyncio.timeout(COMPILE_S):
            text = await asyncio.to_thread(compile_text)  # checks, then compiles
            if text is None:
                return None
            if not info.eos_token_ids:
                raise GenerationError("Structured output needs the model's end-of-sequence "
                                      "token.")
            eos = int(info.eos_token_ids[0])
            # llguidance's view of the vocab: built once, under the tokenizer's lock (cached)
            lt = await backend.tokenize(
                lambda m: grammar.ll_tokenizer(m.tokenizer, info.vocab_size, eos))
            return await asyncio.to_thread(grammar.Constraint.build, lt, text,
                                           vocab_size=info.vocab_size, eos=eos)
    except GenerationError as exc:
        raise ApiError(400, f"{param}: {exc}", param=param) from None
    except TimeoutError:
        raise ApiError(400, f"{param}: the grammar took over {COMPILE_S:g} s to compile; "
                            "simplify the schema.", param=param) from None


async def constraint_of(backend: Backend, body: dict,
                        key: str = "response_format") -> grammar.Constraint | None:
    """The structured output ``body[key]`` asks for (see the module docstring)."""
    rf = body.get(key)
    if rf is None or rf == {"type": "text"}:
        return None
    if isinstance(rf, dict) and rf.get("type") == "json_schema" and "schema" in rf \
            and "json_schema" not in rf:
        rf = {"type": "json_schema", "json_schema": {"schema": rf["schema"]}}
    return await build_constraint(backend, lambda: grammar.compile_format(rf), key)


def _call_schema(tool: dict) -> dict:
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise GenerationError(f"the parameters of tool {fn['name']!r} must be a JSON schema "
                              "object.")
    grammar.check_schema(params)
    if "properties" in params and "additionalProperties" not in params:
        # a tool takes only the parameters it declares (strict tool schemas say so outright)
        params = {**params, "additionalProperties": False}
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def forced_call_grammar(tools: list[dict], name: str | None, *, parallel: bool) -> str:
    """See the module docstring; raises ``GenerationError`` for a name no tool has or a
    parameter schema that cannot be used."""
    import llguidance

    chosen = [t for t in tools if name is None or t["function"]["name"] == name]
    if not chosen:
        raise GenerationError(f"no tool named {name!r} is offered (tools: "
                              f"{', '.join(t['function']['name'] for t in tools)}).")
    schemas = [_call_schema(t) for t in chosen]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    call = json.dumps({**schema, "x-guidance": _LAYOUT})
    repeat = ' ("\\n" call)*' if parallel else ""
    lark = (f'start: call{repeat}\n'
            f'call: "<tool_call>\\n" args "\\n</tool_call>"\n'
            f'args: %json {call}\n')
    try:
        return llguidance.LLMatcher.grammar_from_lark(lark)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise GenerationError(f"the tools' parameter schemas cannot be used: {exc}") from exc


async def forced_constraint(backend: Backend, tools: list[dict], name: str | None, *,
                            parallel: bool, param: str = "tool_choice") -> grammar.Constraint:
    built = await build_constraint(
        backend, lambda: forced_call_grammar(tools, name, parallel=parallel), param)
    assert built is not None
    return built


def max_calls_of(parallel: object, param: str) -> int | None:
    """``parallel_tool_calls`` (OpenAI) -> the most calls a reply reports: 1 when false."""
    if parallel is None:
        return None
    if not isinstance(parallel, bool):
        raise ApiError(400, f"{param} must be true or false", param=param, code="invalid_value")
    return None if parallel else 1


@dataclass(frozen=True)
class ToolUse:
    """What a request lets the model do with tools: ``tools`` go into the prompt (None: no
    tools), ``forced`` says the reply must be a call (of ``name``, or of any tool when None),
    ``max_calls`` bounds the calls reported (None: no bound)."""

    tools: list[dict] | None
    forced: bool = False
    name: str | None = None
    max_calls: int | None = None

    async def constraint(self, backend: Backend, param: str) -> grammar.Constraint | None:
        """The forced call's grammar for one reply (None when no call is forced)."""
        if not self.forced or not self.tools:
            return None
        return await forced_constraint(backend, self.tools, self.name, param=param,
                                       parallel=self.max_calls != 1)

    @classmethod
    def chosen(cls, tools: list[dict] | None, kind: str, *, name: str | None = None,
               max_calls: int | None = None) -> ToolUse:
        """What a tool choice of every API comes to: ``kind`` "none" (no tools in the
        prompt), "auto", or "forced" (a call of ``name``, or of any tool when None)."""
        if kind == "none":
            return cls(None)
        if kind == "auto":
            return cls(tools, max_calls=max_calls)
        if tools is None:
            raise bad_request("tool_choice asks for a tool call, but no tools are offered",
                              "tool_choice")
        return cls(tools, forced=True, name=name, max_calls=max_calls)


def openai_tool_use(tools: list[dict] | None, choice: object, name: str | None,
                    max_calls: int | None, forms: str) -> ToolUse:
    """OpenAI's ``tool_choice`` (Chat Completions and Responses): "auto", "none", "required"
    or a named function (``name``: the name the API's own form of it holds, else None);
    ``forms`` lists the accepted forms for the error."""
    if choice in (None, "auto", "none"):
        return ToolUse.chosen(tools, choice or "auto", max_calls=max_calls)
    if tools is not None and choice != "required" and name is None:
        raise bad_request(f"tool_choice must be {forms}", "tool_choice")
    return ToolUse.chosen(tools, "forced", name=name, max_calls=max_calls)
