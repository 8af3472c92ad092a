"""The Responses API (/v1/responses) as the load generator speaks it: a job's request body, and
its answers read as the chat-completion chunks and message that client.py already times, so
one reader measures every API alike.

A stream's typed events carry the text in `response.output_text.delta` (and a function call's
in `response.function_call_arguments.delta`, reasoning in `response.reasoning_text.delta`):
each is a piece, as a chat chunk's content is. It ends with `response.completed`, or
`response.incomplete` at `max_output_tokens` (no `[DONE]`); `response.failed` and `error` are
the stream's error. Nothing is stored (`store: false`): a benchmark measures generation, and a
run's responses would fill the replica's bounded store.
"""

from typing import Any

from kvpilot_bench.prompts import Job

PATH = "/v1/responses"
_PIECES = (
    "response.output_text.delta",
    "response.function_call_arguments.delta",
    "response.reasoning_text.delta",
)
_ENDS = ("response.completed", "response.incomplete")


def body(job: Job, model: str) -> dict[str, Any]:
    cls, prompt = job.planned.cls, job.prompt
    messages = prompt.messages or [{"role": "user", "content": prompt.text}]
    out: dict[str, Any] = {
        "model": model,
        "input": [{"type": "message", **m} for m in messages],
        "max_output_tokens": job.max_tokens,
        "temperature": cls.temperature,
        "store": False,
    }
    if cls.stream:
        out["stream"] = True
    if cls.ignore_eos:
        out["ignore_eos"] = True  # vLLM's extension, as on chat: outputs run to max tokens
    if cls.service_tier:
        out["service_tier"] = cls.service_tier
    return out


def _usage(response: dict[str, Any] | None) -> dict[str, int] | None:
    usage = (response or {}).get("usage")
    if not usage:
        return None
    return {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"]}


def as_chunk(event: dict[str, Any]) -> dict[str, Any]:
    """A streamed event as the chat chunk that says the same: a piece of text, the end and its
    usage, an error; any other event says nothing."""
    kind = event.get("type")
    if kind in _PIECES:
        return {"choices": [{"index": 0, "delta": {"content": event.get("delta") or ""}}]}
    if kind in _ENDS:
        response = event.get("response") or {}
        reason = "stop" if kind == "response.completed" else "length"
        return {
            "choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
            "usage": _usage(response),
        }
    if kind == "response.failed":
        return {"error": (event.get("response") or {}).get("error") or {"message": "failed"}}
    if kind == "error":
        return {"error": {k: v for k, v in event.items() if k not in ("type", "sequence_number")}}
    return {"choices": []}


def as_completion(response: dict[str, Any]) -> dict[str, Any]:
    """A whole response as the chat completion that says the same: its text and usage."""
    text = "".join(
        part.get("text", "")
        for item in response.get("output") or []
        if item.get("type") == "message"
        for part in item.get("content") or []
    )
    return {"choices": [{"index": 0, "message": {"content": text}}], "usage": _usage(response)}
