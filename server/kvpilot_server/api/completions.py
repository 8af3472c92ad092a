"""Chat and text completions in OpenAI's wire shapes: one JSON body or an SSE stream of chunks.

Bad input is answered before any streaming starts (the first engine output is awaited first),
so a client sees either a clean 4xx JSON error or a stream, never a stream that breaks.
A client that goes away aborts its engine requests: mid-stream the response's generator is
closed; while a non-streaming request runs, a watcher on the connection cancels the collection.
"""

import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kvpilot_common import metric_names as names
from kvpilot_common import trust
from kvpilot_common.http.errors import from_exception
from kvpilot_server.api import responses
from kvpilot_server.api.assistant import ChatShape
from kvpilot_server.api.generation import Choice, Generation
from kvpilot_server.api.protocol import SamplingFields
from kvpilot_server.outputs import RequestOutput


class Completions:
    def __init__(self, generation: Generation, model: str) -> None:
        self.generation, self.model = generation, model
        self.tokenizer = generation.engine.inputs.tokenizer

    async def serve(
        self,
        request: Request,
        parsed: SamplingFields,
        prompt: list[int],
        chat: bool,
        headers: dict[str, str] | None = None,
        shape: ChatShape | None = None,
        lora: str | None = None,
    ) -> Response:
        """A chat or text completion, in OpenAI's wire shapes."""
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        try:
            run = await self.generation.start(request, parsed, prompt, request_id, lora)
        except Exception as exc:
            return from_exception(exc)
        first, stream, outputs, done, who = run.first, run.rest, run.outputs, run.done, run.done.who
        taken_over = parsed.kvpilot_continue  # the stream keeps its id and created
        response_id = taken_over.id if taken_over else request_id
        if shape is not None:  # tool calls' ids derive from the response's
            shape = dataclasses.replace(shape, request_id=response_id)
        envelope = responses.Envelope(response_id, lora or self.model, chat, shape)
        if taken_over:
            envelope.created = taken_over.created
        to_logprobs = responses.chat_logprobs if chat else responses.completion_logprobs
        wants_logprobs = run.logprobs

        def logprobs(samples: list) -> dict | None:
            return to_logprobs(samples, self.tokenizer) if wants_logprobs and samples else None

        if parsed.stream:
            events = _sse(
                first,
                stream,
                outputs,
                envelope,
                Stream(
                    parsed.include_usage,
                    parsed.return_token_ids,
                    taken_over is not None,
                    who.trusted,
                ),
                logprobs,
                done,
            )
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        failed = await self.generation.finish(request, run)
        if failed is not None:
            return failed
        finals: list[RequestOutput] = outputs  # type: ignore[assignment] - all finished
        lps = [
            to_logprobs(o.outputs[0].logprobs or [], self.tokenizer) if wants_logprobs else None
            for o in finals
        ]
        if who.trusted:  # the gateway charges the tenant's tokens (kvpilot_common.trust)
            headers = {**(headers or {}), trust.USAGE_HEADER: str(done.tokens())}
        return JSONResponse(envelope.full(finals, lps, parsed.return_token_ids), headers=headers)


@dataclass(frozen=True)
class Stream:
    """What a stream adds beyond the text: the usage chunk at the end, token ids on each chunk,
    and whether it continues one another replica began (kvpilot_continue)."""

    include_usage: bool
    token_ids: bool
    continued: bool
    report_usage: bool = False  # for kvpilot's gateway: the tokens, in a comment at the end


async def _sse(
    first: Choice,
    rest: AsyncIterator[Choice],
    outputs: list[RequestOutput | None],
    envelope: responses.Envelope,
    stream: Stream,
    logprobs: Callable[[list], dict | None],
    done: Callable[[int, str | None], None],
) -> AsyncIterator[str]:
    def event(body: dict[str, Any]) -> str:
        return f"data: {json.dumps(body)}\n\n"

    sent = [0] * len(outputs)  # logprobs already streamed, per choice
    # Token ids not yet on a chunk, per choice: an output whose text is held back (half a
    # character, a possible stop string) sends nothing, and its ids ride on the next chunk.
    pending: list[list[int]] = [[] for _ in outputs]
    # Choices whose first chunk (carrying the role) went out: a continued stream's did, from
    # the replica that began it.
    opened: set[int] = set(range(len(outputs))) if stream.continued else set()
    if stream.continued:  # the chat parser reads what the client already has, sending nothing
        done_text = first[1].outputs[0].text
        envelope.shape.deltas(
            0, done_text[: len(done_text) - len(first[1].outputs[0].delta_text)], False
        )
    item: Choice | None = first
    try:
        while item is not None:
            index, output = item
            outputs[index] = output
            samples = (output.outputs[0].logprobs or [])[sent[index] :]
            sent[index] += len(samples)
            pending[index] += output.outputs[0].delta_token_ids
            opening = index not in opened
            if output.outputs[0].delta_text or output.finished or opening:
                opened.add(index)
                ids = pending[index] if stream.token_ids else None
                for body in envelope.chunks(index, output, logprobs(samples), opening, ids):
                    if opening and stream.token_ids:
                        body["prompt_token_ids"] = output.prompt_token_ids
                        opening = False
                    yield event(body)
                pending[index] = []
            item = await anext(rest, None)
    except Exception as exc:  # mid-stream failure: say so in the stream, in OpenAI's shape
        done(200, names.OUTCOME_ERROR)
        yield event(json.loads(from_exception(exc).body))
    except BaseException:  # the client went away (cancellation): the engine aborts the request
        done(200, "abort")
        raise
    else:
        done(200, None)
        if stream.include_usage:
            yield event(envelope.usage_chunk(outputs))  # type: ignore[arg-type]
        if stream.report_usage:  # clients skip comments; the gateway reads it
            yield f": {trust.USAGE_COMMENT} {responses.usage(outputs)['total_tokens']}\n\n"  # type: ignore[arg-type]
    yield "data: [DONE]\n\n"
