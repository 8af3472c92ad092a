"""ServingMessages: being written (issue 53)."""

from starlette.requests import Request
from starlette.responses import Response

from kvpilot_server.api.generation import Generation
from kvpilot_server.api.serving import Intake
from kvpilot_server.api.serving_chat import ServingChat


class ServingMessages:
    def __init__(
        self, intake: Intake, chat: ServingChat, generation: Generation, name: str
    ) -> None:
        self.intake, self.chat, self.generation, self.name = intake, chat, generation, name

    async def create(self, request: Request) -> Response:
        raise NotImplementedError

    async def count_tokens(self, request: Request) -> Response:
        raise NotImplementedError
