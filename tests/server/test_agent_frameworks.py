"""Agent frameworks no one here wrote, end to end against the server: OpenAI's
``openai-agents`` (its Responses model, the default, and its Chat Completions model) and
``pydantic-ai`` (its OpenAI Responses, OpenAI Chat and Anthropic models). For each: a plain
answer, a streamed one, a tool call the framework runs itself (a scripted model emits the call;
the framework's tool result must reach the model's prompt; then the final answer), and
structured output with the demo model (a real grammar). docs/agents.md is this module's table.
A test skips, with the reason, only when its framework is not installed."""
from __future__ import annotations

import asyncio
from typing import Literal

import pydantic
import pytest

from engine.server.templates import tool_call_xml

pytestmark = [
    pytest.mark.timeout(300),
    # pydantic-ai warns when a Claude name it profiles passes its provider's retirement date;
    # the name only picks the profile (what the API supports), so the date must not fail CI.
    pytest.mark.filterwarnings("ignore:Model .* is deprecated by its provider"),
]

CALL = tool_call_xml("get_weather", {"city": "Paris"})
FINAL = "It is sunny in Paris."
OPENAI_AGENTS = ["agents-responses", "agents-chat"]
PYDANTIC_AI = ["pydantic-ai-responses", "pydantic-ai-chat", "pydantic-ai-anthropic"]


class Doc(pydantic.BaseModel):
    kind: Literal["function", "class", "module"]
    documented: bool


def _need(name: str):
    module = {"agents": "openai-agents", "pydantic_ai": "pydantic-ai-slim[openai,anthropic]"}
    return pytest.importorskip(name, reason=f"{module[name]} is not installed "
                                            "(pip install -e '.[test]')")


# ---------------------------------------------------------------------- openai-agents

async def _agents_run(kind: str, url: str, *, tools=(), output_type=None, stream=False,
                      settings=None, chain=False):
    agents = _need("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # its traces would go to OpenAI
    cls = agents.OpenAIResponsesModel if kind == "agents-responses" else \
        agents.OpenAIChatCompletionsModel
    async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
        agent = agents.Agent(name="helper", instructions="Answer briefly.", tools=list(tools),
                             model=cls(model="gpt-local", openai_client=client),
                             output_type=output_type,
                             model_settings=agents.ModelSettings(**(settings or {})))
        if not stream:
            result = await agents.Runner.run(agent, "Weather in Paris?",
                                             auto_previous_response_id=chain)
            return result.final_output, []
        run = agents.Runner.run_streamed(agent, "Weather in Paris?")
        deltas = [e.data.delta async for e in run.stream_events()
                  if e.type == "raw_response_event" and _is_text_delta(e.data)]
        return run.final_output, deltas


def _is_text_delta(data) -> bool:
    # Responses: response.output_text.delta; Chat Completions events arrive converted to it
    return getattr(data, "type", "") == "response.output_text.delta"


def _weather_tool(seen: list):
    agents = _need("agents")

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"sunny in {city}"

    return get_weather


@pytest.mark.parametrize("kind", OPENAI_AGENTS)
def test_openai_agents_chat_and_stream(scripted_served, kind):
    model, server = scripted_served
    model.replies[:] = ["Hello there.", "Hello again."]
    text, _ = asyncio.run(_agents_run(kind, server.url))
    assert text == "Hello there."
    text, deltas = asyncio.run(_agents_run(kind, server.url, stream=True))
    assert text == "Hello again." and "".join(deltas) == "Hello again." and len(deltas) > 1


@pytest.mark.parametrize("stream", [False, True], ids=["once", "streamed"])
@pytest.mark.parametrize("kind", OPENAI_AGENTS)
def test_openai_agents_runs_a_tool_call(scripted_served, kind, stream):
    model, server = scripted_served
    model.replies[:] = [CALL, FINAL]
    seen: list[str] = []
    text, _ = asyncio.run(_agents_run(kind, server.url, tools=[_weather_tool(seen)],
                                      stream=stream))
    assert (text, seen) == (FINAL, ["Paris"])
    assert "<tool_response>\nsunny in Paris\n</tool_response>" in model.prompts[-1]


def test_openai_agents_chains_turns_by_previous_response_id(scripted_served, monkeypatch):
    """``auto_previous_response_id``: the second model call sends only the tool's output and
    the id of the first response; the server supplies the rest from its store."""
    model, server = scripted_served
    store = server.app.state.responses
    looked_up: list[str] = []
    get = store.get
    monkeypatch.setattr(store, "get", lambda rid: looked_up.append(rid) or get(rid))
    model.replies[:] = [CALL, FINAL]
    seen: list[str] = []
    text, _ = asyncio.run(_agents_run("agents-responses", server.url, chain=True,
                                      tools=[_weather_tool(seen)]))
    assert (text, seen) == (FINAL, ["Paris"])
    assert len(looked_up) == 1 and looked_up[0].startswith("resp_")
    prompt = model.prompts[-1]
    assert "Weather in Paris?" in prompt and "<function=get_weather>" in prompt
    assert "<tool_response>\nsunny in Paris\n</tool_response>" in prompt


@pytest.mark.parametrize("kind", OPENAI_AGENTS)
def test_openai_agents_structured_output_with_the_demo_model(shared_demo_server, kind):
    out, _ = asyncio.run(_agents_run(kind, shared_demo_server.url, output_type=Doc,
                                     settings={"temperature": 0, "max_tokens": 60}))
    assert isinstance(out, Doc)


# ---------------------------------------------------------------------- pydantic-ai

def _pydantic_model(kind: str, client):
    _need("pydantic_ai")
    if kind == "pydantic-ai-anthropic":
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        # (a current Claude name: pydantic-ai reads what the API supports from it)
        return AnthropicModel("claude-sonnet-4-5",
                              provider=AnthropicProvider(anthropic_client=client))
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    cls = OpenAIResponsesModel if kind == "pydantic-ai-responses" else OpenAIChatModel
    return cls("gpt-local", provider=OpenAIProvider(openai_client=client))


def _client(kind: str, url: str):
    if kind == "pydantic-ai-anthropic":
        from anthropic import AsyncAnthropic

        # anthropic>=2 sends `anthropic-version: 2026-10-21`, under which pydantic-ai drops
        # temperature/top_p/top_k (with a warning); the older version keeps them, as its
        # warning advises, so the demo runs at temperature 0 here.
        return AsyncAnthropic(base_url=url, api_key="unused", max_retries=0,
                              default_headers={"anthropic-version": "2023-06-01"})
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


async def _pydantic_run(kind: str, url: str, **kw):
    _need("pydantic_ai")
    async with _client(kind, url) as client:
        return await _pydantic_agent_run(_pydantic_model(kind, client), **kw)


async def _pydantic_agent_run(model, *, seen=None, output_type=str, stream=False,
                              settings=None):
    from pydantic_ai import Agent

    agent = Agent(model, instructions="Answer briefly.", output_type=output_type,
                  model_settings=settings or {})
    if seen is not None:
        @agent.tool_plain
        def get_weather(city: str) -> str:
            """The weather in a city."""
            seen.append(city)
            return f"sunny in {city}"
    if not stream:
        return (await agent.run("Weather in Paris?")).output, []
    async with agent.run_stream("Weather in Paris?") as run:
        deltas = [d async for d in run.stream_text(delta=True, debounce_by=None)]
    return "".join(deltas), deltas


@pytest.mark.parametrize("kind", PYDANTIC_AI)
def test_pydantic_ai_chat_and_stream(scripted_served, kind):
    model, server = scripted_served
    model.replies[:] = ["Hello there.", "Hello again."]
    text, _ = asyncio.run(_pydantic_run(kind, server.url))
    assert text == "Hello there."
    text, deltas = asyncio.run(_pydantic_run(kind, server.url, stream=True))
    assert text == "Hello again." and len(deltas) > 1


@pytest.mark.parametrize("stream", [False, True], ids=["once", "streamed"])
@pytest.mark.parametrize("kind", PYDANTIC_AI)
def test_pydantic_ai_runs_a_tool_call(scripted_served, kind, stream):
    model, server = scripted_served
    model.replies[:] = [CALL, FINAL]
    seen: list[str] = []
    text, _ = asyncio.run(_pydantic_run(kind, server.url, seen=seen, stream=stream))
    assert (text, seen) == (FINAL, ["Paris"])
    assert "<tool_response>\nsunny in Paris\n</tool_response>" in model.prompts[-1]


@pytest.mark.parametrize("mode", ["tool", "native"])
@pytest.mark.parametrize("kind", PYDANTIC_AI)
def test_pydantic_ai_structured_output_with_the_demo_model(shared_demo_server, kind, mode):
    """``tool``: pydantic-ai's default, an output tool it forces (tool_choice required / any:
    the server's forced-call grammar); ``native``: the API's own structured output."""
    _need("pydantic_ai")
    from pydantic_ai import NativeOutput

    output_type = Doc if mode == "tool" else NativeOutput(Doc)
    out, _ = asyncio.run(_pydantic_run(kind, shared_demo_server.url, output_type=output_type,
                                       settings={"temperature": 0, "max_tokens": 60}))
    assert isinstance(out, Doc)
