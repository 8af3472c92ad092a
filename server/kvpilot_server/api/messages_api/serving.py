"""ServingMessages: /v1/messages and /v1/messages/count_tokens. A request is translated into
the chat core's request (translate.py) and runs through the chat core (ServingChat.prepare:
prompt, tools, reasoning, constraint, adapter) and the generation core every API shares;
only the wire shapes are the Messages API's (answer.py, stream.py, errors.py)."""

import dataclasses
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kvpilot_common import trust
from kvpilot_server.api.fields import ignored_header
from kvpilot_server.api.generation import Generation
from kvpilot_server.api.messages_api import answer, errors
from kvpilot_server.api.messages_api.answer import Blocks
from kvpilot_server.api.messages_api.request import CountTokensRequest, MessagesRequest
from kvpilot_server.api.messages_api.stream import Answer, sse
from kvpilot_server.api.messages_api.thinking import thinking_switch
from kvpilot_server.api.messages_api.translate import chat_request, refuse_extras
from kvpilot_server.api.serving import Intake
from kvpilot_server.api.serving_chat import ServingChat


class ServingMessages:
    def __init__(
        self, intake: Intake, chat: ServingChat, generation: Generation, name: str
    ) -> None:
        self.intake, self.chat, self.generation, self.name = intake, chat, generation, name
        template = intake.engine.inputs.tokenizer.chat_template
        self.thinking = thinking_switch(template, chat.template.reasoning is not None)

    async def create(self, request: Request) -> Response:
        parsed = await self.intake.parse(request, MessagesRequest)
        headers = ignored_header(refuse_extras(parsed))
        chat = chat_request(parsed, self.thinking, parsed.stream)
        ready = await self.chat.prepare(request, chat, headers)
        message_id = f"msg_{uuid.uuid4().hex}"
        shape = dataclasses.replace(ready.shape, request_id=message_id)
        try:
            run = await self.generation.start(request, chat, ready.prompt, message_id, ready.lora)
        except Exception as exc:  # counted by start
            return errors.from_exception(exc)
        model = ready.lora or self.name
        if parsed.stream:
            events = sse(run, Answer(message_id, model, shape))
            return StreamingResponse(events, media_type="text/event-stream", headers=ready.headers)
        failed = await self.generation.finish(request, run)
        if failed is not None:
            return errors.reshaped(failed) if isinstance(failed, JSONResponse) else failed
        output = run.outputs[0]
        assert output is not None  # finish() returned None: every output is in
        blocks = Blocks(message_id)
        blocks.feed(shape.events(0, output.outputs[0].text, True))
        blocks.close()
        reason = answer.stop_reason(output.outputs[0], blocks.called)
        body = answer.message(message_id, model, blocks.blocks, reason, answer.usage(output))
        headers = ready.headers
        if run.done.who.trusted:  # the gateway charges the tenant's tokens (kvpilot_common.trust)
            headers = {**headers, trust.USAGE_HEADER: str(run.done.tokens())}
        return JSONResponse(body, headers=headers)

    async def count_tokens(self, request: Request) -> Response:
        """The prompt create would build for the same body, tokenized, not run."""
        parsed = await self.intake.parse(request, CountTokensRequest)
        headers = ignored_header(refuse_extras(parsed))
        ready = await self.chat.prepare(request, chat_request(parsed, self.thinking), headers)
        return JSONResponse({"input_tokens": len(ready.prompt)}, headers=ready.headers)
