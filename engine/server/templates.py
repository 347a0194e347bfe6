"""Messages and tools -> prompt token ids, through the model's own chat template.

Contract: both APIs first turn their requests into *template messages* — dicts with ``role``
(system/user/assistant/tool), string ``content``, and for assistants optionally
``reasoning_content`` and ``tool_calls`` (``[{"type": "function", "function": {"name",
"arguments": dict}}]``), for tools ``tool_call_id`` / ``name`` — and tools into OpenAI's
``{"type": "function", "function": {...}}`` form. ``chat_prompt_ids`` renders them:

- no tools and no tool turns: ``Model.chat_ids`` (exactly what the chat window and ``engine
  generate --chat`` send, so outputs and the prompt cache line up);
- a template that knows tools (Qwen3.5/3.6, Qwen3): ``engine.models.chat_template.chat_ids`` with
  ``tools=`` (the same Jinja sandbox and the same bounded tokenizing ``Model.chat_ids`` uses);
- a template that does not (the embedded demo model): the Qwen3.5 layout written out here —
  a ``# Tools`` system section, calls as ``<tool_call>`` XML in the assistant turn, results
  as ``<tool_response>`` blocks in a user turn — then ``Model.chat_ids``.

These functions get the model's ``PromptView`` through ``Scheduler.with_tokenizer`` (a
tokenizer of its own, so they run beside the decoding thread); a prompt over the model's
``prompt_limit()`` raises ``PromptTooLongError`` before it is tokenized whole.
"""
from __future__ import annotations

import json

TOOLS_HEADER = (
    "# Tools\n\nYou have access to the following functions:\n\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>"
)


def _template(model) -> str:
    tok = getattr(model, "tokenizer", None)
    return getattr(tok, "chat_template", None) or ""


def template_knows_tools(model) -> bool:
    t = _template(model)
    return "tools" in t and "tool_call" in t


def tools_section(tools: list[dict]) -> str:
    lines = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return TOOLS_HEADER + lines + TOOLS_FOOTER


def tool_call_xml(name: str, arguments: dict) -> str:
    """One call in the Qwen3.5 XML form (what the model is asked to write)."""
    parts = [f"<tool_call>\n<function={name}>\n"]
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        parts.append(f"<parameter={key}>\n{text}\n</parameter>\n")
    parts.append("</function>\n</tool_call>")
    return "".join(parts)


def _written_out(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The Qwen3.5 tool layout as plain system/user/assistant turns (for tool-less templates)."""
    out: list[dict] = []
    rest = list(messages)
    system = ""
    if rest and rest[0]["role"] == "system":
        system = rest.pop(0)["content"]
    if tools:
        system = tools_section(tools) + ("\n\n" + system if system else "")
    if system:
        out.append({"role": "system", "content": system})
    for m in rest:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_turn": True})
            continue
        m = dict(m)
        calls = m.pop("tool_calls", None) or []
        if calls:
            xml = "\n".join(tool_call_xml(c["function"]["name"], c["function"]["arguments"])
                            for c in calls)
            m["content"] = (m.get("content") or "").rstrip("\n") + ("\n\n" if m.get("content") else "") + xml
        out.append(m)
    return [{k: v for k, v in m.items() if k != "_tool_turn"} for m in out]


def chat_prompt_ids(model, messages: list[dict], *, tools: list[dict] | None = None,
                    enable_thinking: bool | None = None) -> list[int]:
    """Prompt ids for a chat request; see the module docstring for the three paths. A
    request with images (decoded by ``engine.server.images``) renders through
    ``chat_prompt`` (an ``ImagePrompt``); images with tools are refused for now."""
    from engine.server.images import has_images

    uses_tools = bool(tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
    if has_images(messages):
        if uses_tools:
            from engine.errors import GenerationError

            raise GenerationError("images together with tools are not supported yet: send "
                                  "the images without tools")
        return model.chat_prompt(messages, enable_thinking=enable_thinking)
    if not uses_tools:
        return list(model.chat_ids(messages, enable_thinking=enable_thinking))
    if not template_knows_tools(model):
        return list(model.chat_ids(_written_out(messages, tools or []),
                                   enable_thinking=enable_thinking))
    from engine.models.chat_template import chat_ids

    limit, context = _limits(model)
    return chat_ids(model.tokenizer, messages, enable_thinking=enable_thinking,
                    supports_thinking=model.info.supports_thinking, tools=tools or None,
                    max_tokens=limit, context=context)


def _limits(model) -> tuple[int | None, int | None]:
    """The request's prompt limit and the model's context (None, None for fakes)."""
    limit = model.prompt_limit() if hasattr(model, "prompt_limit") else None
    return limit, getattr(getattr(model, "info", None), "context_length", None)


def text_prompt_ids(model, text: str) -> list[int]:
    """A raw completion prompt, tokenized as ``engine generate --prompt`` does, in bounded
    memory: over the model's limit it raises ``PromptTooLongError`` before tokenizing all
    of it (``engine.models.prompt_limits``)."""
    from engine.models.prompt_limits import encode_bounded

    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return [min(ord(c), 255) for c in text]
    limit, context = _limits(model)
    return encode_bounded(tok, text, limit=limit, context=context)


def decode_ids(model, ids: list[int]) -> str:
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return "".join(chr(i) for i in ids)
    return tok.decode(list(ids))


def prompt_opens_think(model, ids: list[int]) -> bool:
    """True when the template itself opened a ``<think>`` block (Qwen3.5 with thinking on)."""
    return bool(ids) and decode_ids(model, ids[-8:]).rstrip().endswith("<think>")
