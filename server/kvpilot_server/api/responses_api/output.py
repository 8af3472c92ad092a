"""A Responses API answer built from the output's events (content, reasoning, calls): output
items and the typed stream events that open, fill and close them. The whole response and the
stream come from the same builder fed the same events, so a streamed response ends equal to the
non-streamed one."""

import hashlib
import time
from typing import Any

from kvpilot_server.api.assistant import ChatShape
from kvpilot_server.api.tools import CallArguments, CallStart, Content, Event, Reasoning
from kvpilot_server.outputs import RequestOutput

Body = dict[str, Any]


class ResponseBuilder:
    """One response's output items, growing as events come; `stream` events are its side
    effect (without sequence numbers: the serving object numbers what it sends)."""

    def __init__(self, response_id: str, echo: Body, shape: ChatShape) -> None:
        self.id, self.echo, self.shape = response_id, echo, shape
        self.created_at = int(time.time())
        self.items: list[Body] = []
        self.open: Body | None = None  # the item being written
        self.reasoning_text = ""
        self.response: Body = self._body("in_progress")

    def start(self) -> list[Body]:
        return [
            {"type": "response.created", "response": self.response},
            {"type": "response.in_progress", "response": self.response},
        ]

    def feed(self, events: list[Event]) -> list[Body]:
        out: list[Body] = []
        for event in events:
            if isinstance(event, Content):
                out += self._text("message", event.text)
            elif isinstance(event, Reasoning):
                self.reasoning_text += event.text
                out += self._text("reasoning", event.text)
            elif isinstance(event, CallStart):
                out += self._close()
                item = {
                    "id": self._item_id("fc"),
                    "type": "function_call",
                    "status": "in_progress",
                    "call_id": self.shape.call_id(0, event.index),
                    "name": event.name,
                    "arguments": "",
                }
                out += self._add(item)
            else:
                assert isinstance(event, CallArguments) and self.open is not None
                self.open["arguments"] += event.text
                out.append(self._at("response.function_call_arguments.delta", delta=event.text))
        return out

    def finish(self, output: RequestOutput, usage: Body) -> list[Body]:
        """The last events: the open item closed (incomplete if the output ran out of
        tokens), an empty message if the model wrote nothing, then the whole response."""
        cut = output.outputs[0].finish_reason == "length"
        out = self._close("incomplete" if cut else "completed")
        if not self.items:
            out += self._text("message", "")
            out += self._close("incomplete" if cut else "completed")
        self.response = self._body("incomplete" if cut else "completed")
        self.response["usage"] = usage
        if cut:
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
        kind = "response.incomplete" if cut else "response.completed"
        return [*out, {"type": kind, "response": self.response}]

    def failed(self, error: Body) -> Body:
        """The stream's last event when the engine fails mid-answer."""
        self.response = self._body("failed")
        self.response["error"] = {"code": "server_error", "message": error["message"]}
        return {"type": "response.failed", "response": self.response}

    def _text(self, kind: str, text: str) -> list[Body]:
        out: list[Body] = []
        if self.open is None or self.open["type"] != kind:
            out += self._close()
            if kind == "message":
                item = {"id": self._item_id("msg"), "type": "message", "role": "assistant"}
                part: Body = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            else:
                item = {"id": self._item_id("rs"), "type": "reasoning", "summary": []}
                part = {"type": "reasoning_text", "text": ""}
            out += self._add({**item, "status": "in_progress", "content": []})
            out.append(self._at("response.content_part.added", content_index=0, part=part))
            assert self.open is not None
            self.open["content"].append(dict(part))
        if text:
            self.open["content"][0]["text"] += text
            delta = "response.output_text.delta" if kind == "message" else None
            if delta is not None:
                out.append(self._at(delta, content_index=0, delta=text, logprobs=[]))
            else:
                out.append(self._at("response.reasoning_text.delta", content_index=0, delta=text))
        return out

    def _add(self, item: Body) -> list[Body]:
        self.open = item
        self.items.append(item)
        added = {"type": "response.output_item.added", "output_index": len(self.items) - 1}
        return [{**added, "item": dict(item)}]

    def _close(self, status: str = "completed") -> list[Body]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.items) - 1
        out: list[Body] = []
        if item["type"] == "function_call":
            args = item["arguments"]
            done = "response.function_call_arguments.done"
            out.append(self._at(done, item, index, arguments=args, name=item["name"]))
        else:
            part = item["content"][0]
            if item["type"] == "message":
                done = "response.output_text.done"
                out.append(self._at(done, item, index, content_index=0, text=part["text"]))
                out[-1]["logprobs"] = []
            else:
                done = "response.reasoning_text.done"
                out.append(self._at(done, item, index, content_index=0, text=part["text"]))
            out.append(self._at("response.content_part.done", item, index, part=dict(part)))
            out[-1]["content_index"] = 0
        item["status"] = status
        done_item = {"type": "response.output_item.done", "output_index": index, "item": item}
        return [*out, done_item]

    def _at(
        self, kind: str, item: Body | None = None, index: int | None = None, **fields: Any
    ) -> Body:
        """An event of the open item (or of `item`, at `index`)."""
        item = item if item is not None else self.open
        assert item is not None
        index = index if index is not None else len(self.items) - 1
        return {"type": kind, "item_id": item["id"], "output_index": index, **fields}

    def _item_id(self, prefix: str) -> str:
        """Deterministic per response and position: streamed and whole answers agree."""
        seed = f"{self.id}:{len(self.items)}".encode()
        return f"{prefix}_{hashlib.sha256(seed).hexdigest()[:24]}"

    def _body(self, status: str) -> Body:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            **self.echo,
            "output": [dict(item) for item in self.items],
            "usage": None,
        }


def usage(output: RequestOutput, reasoning_tokens: int) -> Body:
    counted = output.usage
    return {
        "input_tokens": counted.prompt_tokens,
        "input_tokens_details": {"cached_tokens": counted.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": counted.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": counted.prompt_tokens + counted.completion_tokens,
    }
