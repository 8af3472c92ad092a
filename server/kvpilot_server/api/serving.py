"""What every generation API does before its own work: read the body into its model under the
server's limits, refuse generation on an embedding model, and allow kvpilot_continue only from
kvpilot's gateway. The serving objects (serving_chat, serving_completion, serving_responses,
serving_messages) share one `Intake`."""

from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request

from kvpilot_common import trust
from kvpilot_common.errors import InvalidRequestError
from kvpilot_common.http.body import read_body
from kvpilot_server.api.adapters import Adapters
from kvpilot_server.api.protocol import SamplingFields
from kvpilot_server.engine.runtime.async_engine import AsyncEngine

M = TypeVar("M", bound=BaseModel)


class Intake:
    def __init__(
        self,
        engine: AsyncEngine,
        adapters: Adapters,
        body_timeout: float | None,
        gateway_secret: str | None,
    ) -> None:
        self.engine, self.adapters = engine, adapters
        self.body_timeout, self.gateway_secret = body_timeout, gateway_secret

    async def parse(self, request: Request, model: type[M]) -> M:
        """The body as `model`, validated on a worker thread; its model name known (a 404 for
        an unknown one, before any other work)."""
        body = await read_body(request, self.body_timeout)
        parsed = await self.engine.process(model.model_validate_json, body)
        self.adapters.resolve(getattr(parsed, "model", None))
        return parsed

    def generating(self) -> None:
        if self.engine.task == "embed":
            raise InvalidRequestError(
                "This model is an embedding model: it serves /v1/embeddings only", "model"
            )

    def from_gateway(self, request: Request) -> bool:
        """Whether kvpilot's gateway sent this request (it sends the secret)."""
        return trust.authorized(request.headers.get(trust.HEADER), self.gateway_secret)

    def continuing(self, request: Request, parsed: SamplingFields) -> None:
        """kvpilot_continue only from the gateway: with the secret, for one choice."""
        if parsed.kvpilot_continue is None:
            return
        if not self.from_gateway(request):
            raise InvalidRequestError(
                "kvpilot_continue is for kvpilot's gateway, which sends this server's "
                "gateway secret; this request did not",
                "kvpilot_continue",
            )
        if parsed.n != 1:
            raise InvalidRequestError("kvpilot_continue takes one choice (n=1)", "n")
