"""pydantic-ai and langchain-openai, each in its default mode and at the release the test extra
pins, against a real server: the requests these libraries build themselves are accepted and what
comes back parses into the typed object, its arguments holding exactly the keys the schema names.
The cases: tool parameters with `$defs` (a nested Pydantic model, an Enum, a list of models), an
optional field (`null` in its schema), a forced tool, a tool loop whose second request carries
explicit nulls, and tools beside a response format. The tiny model's weights are random: its
text is gibberish but constrained output is valid by construction, so every assertion is about
structure. Each request is recorded as sent, so each test also proves its request had the shape
it is about."""

import asyncio
from typing import Any

from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from pydantic_ai import Agent, AgentRunResult, RunContext
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

from tests.server.api.clients.shapes import (
    MODEL,
    PROMPT,
    Forecast,
    Forecasts,
    Place,
    Recorder,
    Unit,
    defs,
    exact,
    nulls,
    typed,
)

# pydantic-ai: OpenAIChatModel (Chat Completions); an output_type is an output tool by default.
SETTINGS = ModelSettings(max_tokens=100, temperature=0)


def _model(server: str, recorder: Recorder) -> OpenAIChatModel:
    http = recorder.async_client()
    client = AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, http_client=http)
    return OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client))


def _run(agent: Agent[None, Any], model: OpenAIChatModel) -> AgentRunResult[Any]:
    async def run() -> AgentRunResult[Any]:
        async with model.client:  # closed in the loop it ran in: no socket left open
            return await agent.run(PROMPT)

    return asyncio.run(run())


def _calls(result: AgentRunResult[Any]) -> list[ToolCallPart]:
    return [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolCallPart)]


def test_pydantic_ai_output_type_is_a_tool_with_defs_and_comes_back_typed(small_server, recorder):
    model = _model(small_server, recorder)
    result = _run(Agent(model, output_type=Forecast, model_settings=SETTINGS), model)
    assert isinstance(result.output, Forecast) and isinstance(result.output.place.unit, Unit)
    (body,) = recorder.bodies  # one request: the output tool's call ends the run
    (tool,) = body["tools"]
    assert defs(tool) >= {"Place", "Unit"}, tool
    assert body["tool_choice"] == "required"  # no text output allowed: the tool is the answer
    # pydantic-ai says nothing of parallel calls, so more may come: the first is the output.
    first = _calls(result)[0]
    assert typed(first.args_as_dict(), Forecast) == result.output


def test_pydantic_ai_function_tool_gets_a_typed_argument_and_the_loop_sends_nulls(
    small_server, recorder
):
    """A function tool forced, its result sent back (the assistant's message with `content:
    null`), then the output tool. The tool takes a model: pydantic-ai sends that model's schema
    as the parameters, its Enum in $defs. (Place, not Forecasts: two tools' schemas and the
    history fill the small server's 1024-token context otherwise.)"""
    got: list[Place] = []

    def settings(ctx: RunContext[None]) -> ModelSettings:
        # 'none' after the first step keeps the output tool only: the run ends on that call.
        return {**SETTINGS, "tool_choice": ["weather"] if ctx.run_step <= 1 else "none"}

    model = _model(small_server, recorder)
    agent = Agent(model, output_type=Unit, model_settings=settings)

    @agent.tool_plain
    def weather(place: Place) -> str:
        """The weather in a place."""
        got.append(place)
        return "sunny"

    result = _run(agent, model)
    assert got and all(isinstance(p, Place) and isinstance(p.unit, Unit) for p in got)
    assert isinstance(result.output, Unit)
    first, second = recorder.bodies
    assert first["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    tool = next(t for t in first["tools"] if t["function"]["name"] == "weather")
    assert defs(tool) == {"Unit"}, tool
    call = next(c for c in _calls(result) if c.tool_name == "weather")
    exact(call.args_as_dict(), tool["function"]["parameters"])
    # The second request's explicit null (the assistant's content beside its call): accepted.
    assert ".messages[1].content" in nulls(second), nulls(second)
    assert second["tool_choice"] == {"type": "function", "function": {"name": "final_result"}}


# langchain-openai: ChatOpenAI on Chat Completions (the model name asks for nothing else).


def _chat(server: str, recorder: Recorder) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{server}/v1",
        api_key="unused",
        model=MODEL,
        max_tokens=100,
        temperature=0,
        max_retries=0,
        http_client=recorder.client(),
    )


def test_langchain_structured_output_default_is_a_strict_json_schema(small_server, recorder):
    """ChatOpenAI's default method: a strict json_schema response format, the optional field
    made required with `null` allowed (OpenAI's strict rule), $defs kept."""
    structured = _chat(small_server, recorder).with_structured_output(Forecast, include_raw=True)
    out = structured.invoke(PROMPT)
    assert out["parsing_error"] is None and isinstance(out["parsed"], Forecast)
    (body,) = recorder.bodies
    form = body["response_format"]
    assert form["type"] == "json_schema" and form["json_schema"]["strict"] is True, form
    schema = form["json_schema"]["schema"]
    assert set(schema["$defs"]) >= {"Place", "Unit"} and "note" in schema["required"], schema
    assert Forecast.model_validate(exact(out["raw"].content, schema)) == out["parsed"]


def test_langchain_structured_output_by_function_calling(small_server, recorder):
    """The other method: a forced tool. langchain inlines the $refs of a tool's parameters, so
    here kvpilot sees the nesting spelled out (the $defs cases are the others)."""
    chat = _chat(small_server, recorder)
    structured = chat.with_structured_output(Forecasts, method="function_calling", include_raw=True)
    out = structured.invoke(PROMPT)
    assert out["parsing_error"] is None and isinstance(out["parsed"], Forecasts)
    (body,) = recorder.bodies
    assert body["tool_choice"] == {"type": "function", "function": {"name": "Forecasts"}}
    assert body["parallel_tool_calls"] is False
    (call,) = out["raw"].tool_calls
    assert typed(call["args"], Forecasts) == out["parsed"]


def test_langchain_bind_tools_forced_call_has_a_typed_nested_argument(small_server, recorder):
    chat = _chat(small_server, recorder).bind_tools([Forecast], tool_choice="Forecast")
    message = chat.invoke(PROMPT)
    (body,) = recorder.bodies
    assert body["tool_choice"] == {"type": "function", "function": {"name": "Forecast"}}
    assert [c["name"] for c in message.tool_calls][:1] == ["Forecast"], message
    for call in message.tool_calls:  # parallel calls allowed here: each one exact
        assert isinstance(typed(call["args"], Forecast).place.unit, Unit)


def test_langchain_tools_beside_a_response_format(small_server, recorder):
    """with_structured_output's `tools`: a strict json_schema response format and a strict tool
    in one request; the answer is a call with exact arguments or JSON of the format."""
    chat = _chat(small_server, recorder)
    structured = chat.with_structured_output(
        Place, strict=True, tools=[Forecasts], include_raw=True
    )
    out = structured.invoke(PROMPT)
    (body,) = recorder.bodies
    assert body["response_format"]["type"] == "json_schema", body
    assert [t["function"]["name"] for t in body["tools"]] == ["Forecasts"], body
    assert out["parsing_error"] is None
    message = out["raw"]
    if message.tool_calls:
        for call in message.tool_calls:
            typed(call["args"], Forecasts)
    else:
        assert isinstance(out["parsed"], Place)
        assert typed(message.content, Place) == out["parsed"]
