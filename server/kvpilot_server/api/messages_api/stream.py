"""A Messages API answer as server-sent events: message_start, each block's
content_block_start / _delta / _stop, message_delta (stop reason, usage) and message_stop.
Bad input was answered before (the first output is in before the stream starts); a failure
after is an `error` event, and a client that leaves aborts the engine request, as the chat
API's stream does (completions._sse)."""

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from kvpilot_common import metric_names as names
from kvpilot_common import trust
from kvpilot_server.api.assistant import ChatShape
from kvpilot_server.api.generation import Run
from kvpilot_server.api.messages_api import answer, errors
from kvpilot_server.api.messages_api.answer import Blocks


def event(body: dict[str, Any]) -> str:
    return f"event: {body['type']}\ndata: {json.dumps(body)}\n\n"


@dataclass(frozen=True)
class Answer:
    """Who the streamed message is: its id, the model it names, how its text is read."""

    message_id: str
    model: str
    shape: ChatShape


async def sse(run: Run, reply: Answer) -> AsyncIterator[str]:
    blocks = Blocks(reply.message_id)
    index, output = run.first
    run.outputs[index] = output
    # The prompt is read by the first output: its tokens are known; the answer's are not yet.
    counts = {**answer.usage(output), "output_tokens": 0}
    start = answer.message(reply.message_id, reply.model, [], (None, None), counts)
    yield event({"type": "message_start", "message": start})
    item: tuple[int, Any] | None = run.first
    try:
        while item is not None:
            index, output = item
            run.outputs[index] = output
            text = output.outputs[0].delta_text
            for body in blocks.feed(reply.shape.events(0, text, output.finished)):
                yield event(body)
            item = await anext(run.rest, None)
    except Exception as exc:  # mid-stream failure: say so in the stream, in Anthropic's shape
        run.done(200, names.OUTCOME_ERROR)
        yield event(errors.stream_error(exc))
        return
    except BaseException:  # the client went away (cancellation): the engine aborts the request
        run.done(200, "abort")
        raise
    run.done(200, None)
    for body in blocks.close():
        yield event(body)
    counts = answer.usage(output)
    stop, sequence = answer.stop_reason(output.outputs[0], blocks.called)
    delta = {"stop_reason": stop, "stop_sequence": sequence}
    usage = {k: v for k, v in counts.items() if k != "service_tier"}
    yield event({"type": "message_delta", "delta": delta, "usage": usage})
    yield event({"type": "message_stop"})
    if run.done.who.trusted:  # clients skip comments; kvpilot's gateway reads it
        yield f": {trust.USAGE_COMMENT} {run.done.tokens()}\n\n"
