"""openai-agents in its default mode (the Responses API) against a real server: an agent with a
function tool and a Pydantic output_type runs its loop, the tool called, its result sent back,
the final output typed."""

import asyncio
from typing import Literal

from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI
from pydantic import BaseModel, ConfigDict, Field


class Weather(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sunny: bool
    summary: str = Field(max_length=16)


def test_an_agent_calls_its_tool_and_answers_in_its_output_type(small_server):
    called: list[str] = []

    @function_tool
    def weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather in a city."""
        called.append(city)
        return "sunny"

    client = AsyncOpenAI(base_url=f"{small_server}/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="forecaster",
        instructions="Call weather, then answer.",
        tools=[weather],
        output_type=Weather,
        model=OpenAIResponsesModel(model="tiny", openai_client=client),
        # Required first; the SDK resets it after a call, so the second turn may answer.
        model_settings=ModelSettings(tool_choice="required", max_tokens=100, temperature=0),
    )
    config = RunConfig(tracing_disabled=True)
    result = asyncio.run(Runner.run(agent, "Weather in Paris?", max_turns=4, run_config=config))
    assert called and isinstance(result.final_output, Weather)
    kinds = [item.type for item in result.new_items]
    calls = kinds.count("tool_call_item")
    assert calls == len(called) == kinds.count("tool_call_output_item") > 0, kinds
    assert kinds[-1] == "message_output_item", kinds  # the typed answer, after the results
