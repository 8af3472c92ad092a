"""ServingResponses: POST /v1/responses (whole or streamed), GET and DELETE of a stored one,
and its input items.
The request becomes a chat request (request.py) served by the shared core; the output's events
build the response (output.py); a stored response's conversation is what a continuation reads.
"""

import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kvpilot_common import metric_names as names
from kvpilot_common import stored_ids, trust
from kvpilot_common.http.auth import caller
from kvpilot_common.http.errors import from_exception
from kvpilot_server.api.fields import REFUSED_RESPONSES, check_extras, ignored_header
from kvpilot_server.api.generation import Generation, Run
from kvpilot_server.api.prompts import ContextOverflow
from kvpilot_server.api.protocol import ChatCompletionRequest
from kvpilot_server.api.responses_api.input_items import input_items, page
from kvpilot_server.api.responses_api.output import ResponseBuilder, usage
from kvpilot_server.api.responses_api.request import ResponsesRequest
from kvpilot_server.api.responses_api.store import ResponseStore
from kvpilot_server.api.serving import Intake
from kvpilot_server.api.serving_chat import ServingChat

Body = dict[str, Any]


class ServingResponses:
    def __init__(
        self,
        intake: Intake,
        chat: ServingChat,
        generation: Generation,
        name: str,
        store: ResponseStore,
    ) -> None:
        self.intake, self.chat, self.generation, self.name = intake, chat, generation, name
        self.store = store
        self.engine = intake.engine

    async def create(self, request: Request) -> Response:
        parsed = await self.intake.parse(request, ResponsesRequest)
        headers = ignored_header(check_extras(parsed, REFUSED_RESPONSES))
        owner = caller(request).tenant
        history: list[Body] = []
        if parsed.previous_response_id is not None:
            where = "previous_response_id"
            history = self.store.get(owner, parsed.previous_response_id, where).conversation
        body = parsed.chat_body(history)
        chat = await self.engine.process(ChatCompletionRequest.model_validate, body)
        ready = await self.chat.prepare(request, chat, headers, self._overflow(parsed))
        # The tag the gateway names this replica by, believed only from the gateway.
        tag = (
            request.headers.get(trust.REPLICA_HEADER) if self.intake.from_gateway(request) else None
        )
        response_id = stored_ids.new_id(tag)
        shape = dataclasses.replace(ready.shape, request_id=response_id)
        run = await self.generation.start(request, chat, ready.prompt, response_id, ready.lora)
        builder = ResponseBuilder(response_id, self._echo(parsed, ready.lora), shape)
        kept = Kept(
            self, parsed.store, owner, [*history, *parsed.conversation()], input_items(parsed)
        )
        if parsed.stream:
            events = self._events(run, builder, kept)
            return StreamingResponse(events, media_type="text/event-stream", headers=ready.headers)
        failed = await self.generation.finish(request, run)
        if failed is not None:
            return failed
        output = run.outputs[0]
        assert output is not None
        builder.feed(shape.events(0, output.outputs[0].text, True))
        builder.finish(output, self._usage(output, builder))
        kept(builder)
        headers = ready.headers
        if run.done.who.trusted:  # the gateway charges the tenant's tokens (kvpilot_common.trust)
            headers = {**headers, trust.USAGE_HEADER: str(run.done.tokens())}
        return JSONResponse(builder.response, headers=headers)

    async def retrieve(self, request: Request) -> Response:
        stored = self.store.get(caller(request).tenant, request.path_params["response_id"])
        return JSONResponse(stored.response)

    async def input_items(self, request: Request) -> Response:
        stored = self.store.get(caller(request).tenant, request.path_params["response_id"])
        return JSONResponse(page(stored.items, request.query_params))

    async def delete(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        self.store.delete(caller(request).tenant, response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    async def _events(self, run: Run, builder: ResponseBuilder, kept: "Kept") -> AsyncIterator[str]:
        numbered = 0

        def sse(event: Body) -> str:
            nonlocal numbered
            event["sequence_number"] = numbered
            numbered += 1
            return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

        for event in builder.start():
            yield sse(event)
        item = run.first
        try:
            while item is not None:
                output = item[1]
                run.outputs[0] = output
                text = output.outputs[0].delta_text
                for event in builder.feed(builder.shape.events(0, text, output.finished)):
                    yield sse(event)
                item = await anext(run.rest, None)
        except Exception as exc:  # mid-stream failure: the response fails, in the stream
            run.done(200, names.OUTCOME_ERROR)
            yield sse(builder.failed(json.loads(from_exception(exc).body)["error"]))
            return
        except BaseException:  # the client went away (cancellation): the engine aborts it
            run.done(200, "abort")
            raise
        run.done(200, None)
        final = run.outputs[0]
        assert final is not None
        closing = builder.finish(final, self._usage(final, builder))
        kept(builder)  # before the last event: a client continuing at once finds it
        for event in closing:
            yield sse(event)
        if run.done.who.trusted:  # clients skip comments; the gateway reads it
            yield f": {trust.USAGE_COMMENT} {run.done.tokens()}\n\n"

    def _usage(self, output: Any, builder: ResponseBuilder) -> Body:
        reasoning = builder.shape.reasoning
        tokens = 0
        if builder.reasoning_text and reasoning is not None:
            decode = self.engine.inputs.tokenizer.decode
            tokens = thinking_tokens(output.outputs[0].token_ids, reasoning.end, decode)
        return usage(output, tokens)

    def _overflow(self, parsed: ResponsesRequest) -> ContextOverflow:
        """`truncation` as the context policy: auto drops the oldest turns (as OpenAI drops
        the conversation's first items), disabled refuses; absent, the server's policy."""
        if parsed.truncation is None:
            return self.chat.overflow
        return "truncate-oldest" if parsed.truncation == "auto" else "reject"

    def _echo(self, parsed: ResponsesRequest, lora: str | None) -> Body:
        """The request's settings as the response object repeats them."""
        tools = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": t.strict,
            }
            for t in parsed.tools or []
        ]
        choice = parsed.tool_choice
        text_format = parsed.text.format if parsed.text else None
        reasoning = parsed.reasoning
        return {
            "model": lora or self.name,
            "instructions": parsed.instructions,
            "tools": tools,
            "tool_choice": choice.model_dump()
            if choice and not isinstance(choice, str)
            else (choice or "auto"),
            "parallel_tool_calls": parsed.parallel_tool_calls,
            "temperature": 1.0 if parsed.temperature is None else parsed.temperature,
            "top_p": 1.0 if parsed.top_p is None else parsed.top_p,
            "max_output_tokens": parsed.max_output_tokens,
            "previous_response_id": parsed.previous_response_id,
            "reasoning": reasoning.model_dump() if reasoning else {"effort": None, "summary": None},
            "text": {
                "format": text_format.model_dump(by_alias=True, exclude_none=True)
                if text_format
                else {"type": "text"}
            },
            "truncation": "auto" if self._overflow(parsed) == "truncate-oldest" else "disabled",
            "metadata": parsed.metadata or {},
            "store": parsed.store,
            "service_tier": parsed.service_tier or "default",
            "user": parsed.user,
            "background": False,
        }


@dataclasses.dataclass
class Kept:
    """What storing a finished response needs: the store, whether to, whose, and the chat
    turns that led to it (without the instructions: a continuation does not inherit them)."""

    serving: ServingResponses
    wanted: bool
    owner: str
    asked: list[Body]
    items: list[Body]  # the request's input, as input_items lists it

    def __call__(self, builder: ResponseBuilder) -> None:
        if self.wanted:
            turn = assistant_turn(builder.items)
            conversation = [*self.asked, turn]
            self.serving.store.put(self.owner, builder.response, conversation, self.items)


def thinking_tokens(ids: list[int], end: str, decode: Callable[[list[int]], str]) -> int:
    """How many of the generated tokens were thinking: those up to the one that completes the
    end tag (all of them if it never came: the tokens ran out while thinking). Counted on the
    tokens, not by encoding the reasoning text again, which can give more tokens than were
    generated (a token's partial UTF-8 decodes to a replacement character). Whether the tag
    is in the first k tokens' text only turns true as k grows: bisected, a few decodes."""
    low, high = 0, len(ids)  # the tag is not in ids[:low]'s text; it may be in ids[:high]'s
    if end not in decode(ids):
        return len(ids)
    while high - low > 1:
        middle = (low + high) // 2
        if end in decode(ids[:middle]):
            high = middle
        else:
            low = middle
    return high


def assistant_turn(items: list[Body]) -> Body:
    """The response's output as the chat turn a continuation replays."""
    text = "".join(
        part["text"] for item in items if item["type"] == "message" for part in item["content"]
    )
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        for item in items
        if item["type"] == "function_call"
    ]
    turn: Body = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        turn["tool_calls"] = calls
    return turn
