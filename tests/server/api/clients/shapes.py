"""What the client-library tests share: the models the libraries turn into schemas, the check
that arguments hold exactly the keys their schema names, and a recorder of each request body as
it went on the wire (so a test also proves its request had the shape it is about)."""

import enum
import json
from typing import Any, TypeVar

import httpx2
import jsonschema
from pydantic import BaseModel, Field

from kvpilot_server.api.json_schemas import closed

MODEL = "tiny"  # the name the small server answers to
PROMPT = "What is the weather in Paris?"


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


# Plain models, as users write them: nothing said of extra keys (exact() closes them to check).
class Place(BaseModel):
    city: str = Field(max_length=12)  # bounded, so a call fits the tests' max_tokens
    unit: Unit


class Forecast(BaseModel):
    place: Place  # a nested model: $defs and $ref
    note: str | None = Field(default=None, max_length=12)  # optional: `null` in its schema


class Forecasts(BaseModel):
    places: list[Place] = Field(min_length=1, max_length=2)  # a list of models


def exact(arguments: str | dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The arguments as the server wrote them, checked against the schema closed: pydantic alone
    drops keys it does not know, so it could not tell an extra key from none."""
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(value, closed(schema))
    return value


M = TypeVar("M", bound=BaseModel)


def typed(arguments: str | dict[str, Any], model: type[M]) -> M:
    return model.model_validate(exact(arguments, model.model_json_schema()))


class Recorder:
    """Each request body a library sends. Its HTTP clients are the libraries' own transport, so
    what is recorded is what the server received."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self._clients: list[httpx2.Client] = []

    def _take(self, request: httpx2.Request) -> None:
        self.bodies.append(json.loads(request.content))

    async def _atake(self, request: httpx2.Request) -> None:
        self._take(request)

    def client(self) -> httpx2.Client:
        self._clients.append(httpx2.Client(event_hooks={"request": [self._take]}, timeout=60))
        return self._clients[-1]

    def async_client(self) -> httpx2.AsyncClient:
        # Closed by whoever runs the loop it is used in (an async client closes in its loop).
        return httpx2.AsyncClient(event_hooks={"request": [self._atake]}, timeout=60)

    def close(self) -> None:
        for client in self._clients:
            client.close()


def defs(tool: dict[str, Any]) -> set[str]:
    """The names a function tool's parameters define for their $refs."""
    return set(tool["function"]["parameters"].get("$defs", {}))


def nulls(value: Any, path: str = "") -> list[str]:
    """Where a request body holds an explicit JSON null."""
    if value is None:
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in nulls(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in nulls(v, f"{path}[{i}]")]
    return []
