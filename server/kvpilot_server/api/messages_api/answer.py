"""The model's output as a Messages API answer: content blocks (thinking, text, tool_use) made
from the chat core's events (assistant.ChatShape.events), whole or as stream events. One
builder makes both, fed the whole text at once or piece by piece, so a streamed answer
accumulates to exactly the non-streamed one."""

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from kvpilot_server.api.tools import CallArguments, CallStart, Content, Event, Reasoning
from kvpilot_server.outputs import CompletionOutput, RequestOutput

# Anthropic's thinking blocks carry a signature it verifies when they come back; kvpilot drops
# past thinking (translate.py), so there is nothing to sign: the field is there, empty.
SIGNATURE = ""


def tool_use_id(message_id: str, index: int) -> str:
    """Deterministic per answer, in Anthropic's style."""
    digest = hashlib.sha256(f"{message_id}:{index}".encode()).hexdigest()
    return f"toolu_{digest[:24]}"


@dataclass
class Blocks:
    """Content blocks as events arrive; `feed` and `close` return the stream events that
    build them (content_block_start, _delta, _stop)."""

    message_id: str
    blocks: list[dict[str, Any]] = field(default_factory=list)
    _arguments: dict[int, str] = field(default_factory=dict)  # block index -> input JSON text
    _open: str | None = None  # the open block's kind
    _call: int | None = None  # the open tool_use block's call index

    def feed(self, events: list[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            out += self._event(event)
        return out

    def close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        index = len(self.blocks) - 1
        self._open = self._call = None
        if index in self._arguments:
            self.blocks[index]["input"] = _object(self._arguments[index])
        return [{"type": "content_block_stop", "index": index}]

    @property
    def called(self) -> bool:
        return any(b["type"] == "tool_use" for b in self.blocks)

    def _event(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, CallStart):
            block = {
                "type": "tool_use",
                "id": tool_use_id(self.message_id, event.index),
                "name": event.name,
                "input": {},
            }
            out = self._start(block)
            self._call = event.index
            self._arguments[len(self.blocks) - 1] = ""
            return out
        if isinstance(event, CallArguments):
            if self._call != event.index or not event.text:
                return []  # arguments of a call not open cannot occur: the parser orders them
            self._arguments[len(self.blocks) - 1] += event.text
            return [self._delta({"type": "input_json_delta", "partial_json": event.text})]
        assert isinstance(event, Content | Reasoning)
        if not event.text:
            return []
        kind, key = ("text", "text") if isinstance(event, Content) else ("thinking", "thinking")
        out = []
        if self._open != kind:
            block = {"type": kind, kind: ""}
            if kind == "thinking":
                block["signature"] = SIGNATURE
            out = self._start(block)
        self.blocks[-1][key] += event.text
        return [*out, self._delta({"type": f"{kind}_delta", key: event.text})]

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        out = self.close()
        self.blocks.append(dict(block))
        self._open = block["type"]
        index = len(self.blocks) - 1
        return [*out, {"type": "content_block_start", "index": index, "content_block": block}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}


def _object(text: str) -> dict[str, Any]:
    """A call's input: its arguments' JSON object ({} where the output broke off)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def stop_reason(completion: CompletionOutput, called: bool) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a finished output."""
    if completion.finish_reason == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if isinstance(completion.stop_reason, str):  # the stop string that ended it (detokenizer)
        return "stop_sequence", completion.stop_reason
    return "end_turn", None


def usage(output: RequestOutput) -> dict[str, Any]:
    """Anthropic counts prompt tokens read from the cache apart from the others: their sum is
    the prompt (what count_tokens answers). kvpilot's prefix cache writes as it goes, at no
    extra cost, so no tokens count as written to it."""
    counts = output.usage
    return {
        "input_tokens": counts.prompt_tokens - counts.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": counts.cached_tokens,
        "output_tokens": counts.completion_tokens,
        "service_tier": "standard",
    }


def message(
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    reason: tuple[str | None, str | None],
    counts: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason[0],
        "stop_sequence": reason[1],
        "usage": counts,
    }
