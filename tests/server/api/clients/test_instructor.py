"""instructor in its default mode for an OpenAI client (TOOLS: the response model as a forced
function tool, its schema with `$defs`) against a real server: a nested model with an Enum and
an optional field, and an `Iterable[Model]` extraction, each parsed into its types with exactly
the keys its schema names.

instructor is not in the test extra: every release (1.17.0 the newest) caps jiter below 0.15,
and openai 3.50 and later (pydantic-ai's openai extra among those asking for it) need 0.16 or
later, so no resolver installs both. scripts/setup.sh installs it without its dependencies (it
runs on the newer jiter)."""

from collections.abc import Iterable
from typing import Any

import instructor
import openai

from tests.server.api.clients.shapes import (
    MODEL,
    PROMPT,
    Forecast,
    Place,
    Recorder,
    Unit,
    defs,
    exact,
    typed,
)


def _client(server: str, recorder: Recorder) -> Any:  # an instructor.Instructor
    raw = openai.OpenAI(
        base_url=f"{server}/v1", api_key="unused", max_retries=0, http_client=recorder.client()
    )
    client = instructor.from_openai(raw)
    assert client.mode == instructor.Mode.TOOLS  # the default this file is about
    return client


def test_instructor_tools_mode_extracts_a_nested_model_with_an_enum(small_server, recorder):
    client = _client(small_server, recorder)
    forecast, completion = client.chat.completions.create_with_completion(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        response_model=Forecast,
        max_tokens=100,
        temperature=0,
        max_retries=0,  # one attempt: a retry would hide a first answer that failed to parse
    )
    assert isinstance(forecast, Forecast) and isinstance(forecast.place.unit, Unit)
    (body,) = recorder.bodies
    (tool,) = body["tools"]
    assert defs(tool) >= {"Place", "Unit"}, tool
    assert body["tool_choice"] == {"type": "function", "function": {"name": "Forecast"}}
    call = completion.choices[0].message.tool_calls[0]
    # instructor returns its own subclass of the model: compare the values.
    assert typed(call.function.arguments, Forecast).model_dump() == forecast.model_dump()


def test_instructor_tools_mode_extracts_an_iterable_of_models(small_server, recorder):
    """instructor wraps Iterable[Place] in a tool of its own (`tasks`: a list of $ref Place).
    It requires nothing of the list, so it may come back empty: the check is of the arguments'
    keys against the schema instructor sent, and of each item's type."""
    client = _client(small_server, recorder)
    places, completion = client.chat.completions.create_with_completion(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        response_model=Iterable[Place],
        max_tokens=100,
        temperature=0,
        max_retries=0,
    )
    assert all(isinstance(p, Place) and isinstance(p.unit, Unit) for p in places)
    (body,) = recorder.bodies
    (tool,) = body["tools"]
    assert defs(tool) >= {"Place", "Unit"}, tool
    name = tool["function"]["name"]  # instructor's own wrapper's name
    assert body["tool_choice"] == {"type": "function", "function": {"name": name}}
    call = completion.choices[0].message.tool_calls[0]
    arguments = exact(call.function.arguments, tool["function"]["parameters"])
    assert [Place.model_validate(p).model_dump() for p in arguments["tasks"]] == [
        p.model_dump() for p in places
    ]
