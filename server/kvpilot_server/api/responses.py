"""OpenAI response and stream-chunk bodies built from engine outputs."""

import time
from typing import Any

from transformers import PreTrainedTokenizerBase

from kvpilot_server.api.assistant import ChatShape
from kvpilot_server.outputs import RequestOutput, Sample


def usage(outputs: list[RequestOutput]) -> dict[str, Any]:
    """One prompt, n completions: the prompt counts once, completion tokens add up."""
    prompt = outputs[0].usage
    completion_tokens = sum(o.usage.completion_tokens for o in outputs)
    return {
        "prompt_tokens": prompt.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": prompt.cached_tokens},
    }


def finish_reason(output: RequestOutput) -> str | None:
    reason = output.outputs[0].finish_reason
    return {"abort": "stop", "error": "stop"}.get(reason, reason) if reason else None


def chat_logprobs(samples: list[Sample], tok: PreTrainedTokenizerBase) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = tok.decode([token_id])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {
        "content": [
            {
                **entry(s.token_id, s.logprob),
                "top_logprobs": [entry(t, lp) for t, lp in s.top_logprobs or []],
            }
            for s in samples
        ]
    }


def completion_logprobs(samples: list[Sample], tok: PreTrainedTokenizerBase) -> dict[str, Any]:
    tokens = [tok.decode([s.token_id]) for s in samples]
    offsets, position = [], 0
    for text in tokens:
        offsets.append(position)
        position += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [s.logprob for s in samples],
        "top_logprobs": [{tok.decode([t]): lp for t, lp in s.top_logprobs or []} for s in samples],
        "text_offset": offsets,
    }


class Envelope:
    """The id/created/model fields every body of one response shares; for chat, the shape that
    reads tool calls and reasoning out of the text."""

    def __init__(
        self, request_id: str, model: str, chat: bool, shape: ChatShape | None = None
    ) -> None:
        self.id, self.model, self.chat, self.created = request_id, model, chat, int(time.time())
        self.shape = shape or ChatShape(request_id, None, None)

    def body(self, obj: str, choices: list[dict], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def full(
        self, outputs: list[RequestOutput], logprobs: list[dict | None], token_ids: bool = False
    ) -> dict[str, Any]:
        choices = []
        for index, (output, lp) in enumerate(zip(outputs, logprobs, strict=True)):
            choice = {"index": index, "logprobs": lp, "finish_reason": finish_reason(output)}
            if token_ids:
                choice["token_ids"] = list(output.outputs[0].token_ids)
            text = output.outputs[0].text
            if self.chat:
                choice["message"], called = self.shape.message(index, text)
                if called and choice["finish_reason"] == "stop":
                    choice["finish_reason"] = "tool_calls"
            else:
                choice["text"] = text
            choices.append(choice)
        obj = "chat.completion" if self.chat else "text_completion"
        extra = {"prompt_token_ids": outputs[0].prompt_token_ids} if token_ids else {}
        return self.body(obj, choices, usage=usage(outputs), **extra)

    def chunks(
        self,
        index: int,
        output: RequestOutput,
        logprobs: dict | None,
        first: bool = False,
        token_ids: list[int] | None = None,
    ) -> list[dict[str, Any]]:
        """The chunks one engine output adds to choice `index`: one, or for chat as many as
        the text holds kinds of delta (content, reasoning, each call's start and arguments);
        the logprobs and `token_ids` (given: return_token_ids) ride on the first, the finish
        reason on the last."""
        text = output.outputs[0].delta_text
        reason = finish_reason(output) if output.finished else None
        ids = {} if token_ids is None else {"token_ids": token_ids}
        if not self.chat:
            choice = {"index": index, "logprobs": logprobs, "finish_reason": reason, "text": text}
            return [self.body("text_completion", [choice | ids])]
        deltas = self.shape.deltas(index, text, output.finished)
        if not deltas:  # text held back (a marker may be starting): only role or end to send
            if not (first or output.finished or logprobs or token_ids):
                return []
            deltas = [{"content": ""}]
        if first:
            deltas[0] = {"role": "assistant", **deltas[0]}
        if reason == "stop" and self.shape.called(index):
            reason = "tool_calls"
        bodies = []
        for i, delta in enumerate(deltas):
            last = i == len(deltas) - 1
            choice = {
                "index": index,
                "logprobs": logprobs if i == 0 else None,
                "finish_reason": reason if last else None,
                "delta": delta,
            }
            bodies.append(self.body("chat.completion.chunk", [choice | (ids if i == 0 else {})]))
        return bodies

    def usage_chunk(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return self.body(obj, [], usage=usage(outputs))
