"""Resources that live as long as one HTTP request, released whatever way it ends.

A streaming response outlives its handler, and the ASGI server may cancel either at any await
(client gone). The middleware opens an exit stack around the whole ASGI call; handlers push
what must be undone (admission slots, open engine streams) and it is undone when the call ends:
after the last byte, on an error, on cancellation, or if the response never started.
"""

import contextlib

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

_KEY = "kvpilot.exit_stack"


class RequestScope:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        async with contextlib.AsyncExitStack() as stack:
            scope[_KEY] = stack
            await self.app(scope, receive, send)


def exit_stack(request: Request) -> contextlib.AsyncExitStack:
    """The current request's exit stack (RequestScope must wrap the app)."""
    return request.scope[_KEY]
