"""One request against an OpenAI-compatible server, timed, with its outcome.

Streaming requests are read as server-sent events: the first chunk with text is the first token,
the gaps between later chunks with text are the inter-token latencies (one chunk per token on
kvpilot and vLLM), and usage comes from the final chunk (stream_options.include_usage). A planned
cancellation closes the connection at the sampled time or after the sampled number of streamed
tokens, which is how a user's client gives up; the server should abort the request.

Outcomes: ok, cancelled, http_<code> (429 is a rejection; every other 4xx and 5xx by its code),
stream_error (an error event after the stream began), timeout (the client's own deadline),
connection_error (refused, reset, or a stream cut short), interrupted (stopped by Ctrl-C).

The Responses API's answers are read as chat's (responses_wire.py). A structured request (its
planned variant) sends `response_format` or `tools` and
`tool_choice`; a streamed tool call's name and argument fragments are tokens like content's. Its
answer, put together from the deltas when streamed, is checked when it completed (validity.py).
"""

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import httpx

from kvpilot_bench import responses_wire
from kvpilot_bench.prompts import Job
from kvpilot_bench.validity import Answer, Reassembly, check

# OpenAI-shaped error bodies name the status as a code ("request_timeout"); back to numbers.
_CODES = {s.phrase.lower().replace(" ", "_"): s.value for s in HTTPStatus}
PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": responses_wire.PATH,
}
Read = Callable[[dict], dict]  # an answer's JSON as the chat API would say it


def _as_is(answer: dict) -> dict:
    return answer


@dataclass(frozen=True)
class Endpoint:
    root: str  # scheme://host:port[/prefix], without /v1
    model: str
    api_key: str | None = None
    label: str = ""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class Record:
    index: int
    cls: str
    stream: bool
    sent_at: float  # seconds after the run started
    lag: float = 0.0  # seconds the load generator sent it after its planned time
    planned_cancel: bool = False
    clamped: bool = False
    outcome: str | None = None  # None while in flight
    status: int | None = None
    ttft: float | None = None  # seconds; streaming requests only
    e2e: float | None = None  # seconds from sending to the last byte (or to the cancel)
    itl: list[float] = field(default_factory=list)  # seconds between streamed tokens
    tokens_in: int | None = None  # the server's usage, else our count
    tokens_out: int = 0
    error: str | None = None
    variant: str | None = None  # a structured request's variant
    valid: bool | None = None  # its answer checked (validity.py); None: not checked
    failure: str | None = None  # validity.FAILURES, when not valid
    failure_detail: str | None = None


def body(job: Job, model: str) -> dict:
    cls, prompt = job.planned.cls, job.prompt
    out: dict = {"model": model, "max_tokens": job.max_tokens, "temperature": cls.temperature}
    if cls.api == "chat":
        out["messages"] = prompt.messages or [{"role": "user", "content": prompt.text}]
    elif prompt.text:
        out["prompt"] = prompt.text
    else:
        assert prompt.messages is not None  # a Prompt has its text or its messages
        out["prompt"] = "\n\n".join(str(m.get("content")) for m in prompt.messages)
    if cls.stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    if cls.ignore_eos:
        out["ignore_eos"] = True  # vLLM's extension, also kvpilot's: outputs run to max_tokens
    if cls.service_tier:
        out["service_tier"] = cls.service_tier
    variant = job.planned.structured
    if variant is not None:
        if variant.response_format is not None:
            out["response_format"] = variant.response_format
        if variant.tools:
            out["tools"] = list(variant.tools)
        if variant.tool_choice is not None:
            out["tool_choice"] = variant.tool_choice
    return out


async def send(
    http: httpx.AsyncClient, endpoint: Endpoint, job: Job, rec: Record, timeout_s: float
) -> None:
    """Fill `rec` with what happened to `job`. Never raises but for cancellation."""
    cls, planned = job.planned.cls, job.planned
    responses = cls.api == "responses"  # read as chat says it (responses_wire)
    sent = responses_wire.body(job, endpoint.model) if responses else body(job, endpoint.model)
    request = http.build_request(
        "POST", endpoint.root + PATHS[cls.api], json=sent, headers=endpoint.headers
    )
    cancel_at = planned.cancel_after_s
    limit = timeout_s if cancel_at is None else min(timeout_s, cancel_at)
    variant = planned.structured
    assembly = Reassembly() if variant is not None else None
    answer = Answer()
    if variant is not None:
        rec.variant = variant.name
    start = time.perf_counter()
    try:
        async with asyncio.timeout(limit):
            read: Read
            if cls.stream:
                read = responses_wire.as_chunk if responses else _as_is
                await _stream(
                    http, request, rec, start, planned.cancel_after_tokens, assembly, read
                )
                if assembly is not None:
                    answer = assembly.answer()
            else:
                read = responses_wire.as_completion if responses else _as_is
                answer = await _whole(http, request, rec, read)
    except TimeoutError:
        rec.outcome = "cancelled" if cancel_at is not None and cancel_at <= timeout_s else "timeout"
    except httpx.TimeoutException:
        rec.outcome = "timeout"
    except httpx.TransportError as exc:
        rec.outcome, rec.error = "connection_error", f"{type(exc).__name__}: {exc}"[:200]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not what the API promises
        rec.outcome, rec.error = "stream_error", f"unreadable answer: {exc}"[:200]
    if rec.e2e is None:
        rec.e2e = time.perf_counter() - start
    if variant is not None and rec.outcome == "ok":
        rec.failure, rec.failure_detail = check(variant, answer)
        rec.valid = rec.failure is None


async def _stream(
    http: httpx.AsyncClient,
    request: httpx.Request,
    rec: Record,
    start: float,
    cancel_after_tokens: int | None,
    assembly: Reassembly | None = None,
    read: Read = _as_is,
) -> None:
    response = await http.send(request, stream=True)
    try:
        rec.status = response.status_code
        if response.status_code != 200:
            await response.aread()
            _http_error(rec, response)
            return
        pieces, last, finished = 0, start, False
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                finished = True
                break
            chunk = read(json.loads(data))
            if "error" in chunk:
                _stream_error(rec, chunk["error"])
                return
            _usage(rec, chunk.get("usage"))
            for choice in chunk.get("choices") or []:
                if assembly is not None and choice.get("index", 0) == 0:
                    assembly.add(choice)
                finished = finished or bool(choice.get("finish_reason"))
                if not _has_text(choice):
                    continue
                now = time.perf_counter()
                if pieces == 0:
                    rec.ttft = now - start
                else:
                    rec.itl.append(now - last)
                last, pieces = now, pieces + 1
                rec.tokens_out = max(rec.tokens_out, pieces)
            if cancel_after_tokens is not None and pieces >= cancel_after_tokens and not finished:
                rec.outcome, rec.e2e = "cancelled", time.perf_counter() - start
                return  # closing the response closes the connection mid-stream
        rec.e2e = time.perf_counter() - start
        rec.outcome = "ok" if finished else "connection_error"
        if not finished:
            rec.error = "the stream ended before [DONE]"
    finally:
        await response.aclose()


def _has_text(choice: dict) -> bool:
    """Did this streamed choice carry generated text: content, a completion's text, or a tool
    call's name or arguments?"""
    delta = choice.get("delta") or {}
    if delta.get("content") or choice.get("text"):
        return True
    return any(
        (call.get("function") or {}).get(key)
        for call in delta.get("tool_calls") or []
        for key in ("name", "arguments")
    )


async def _whole(
    http: httpx.AsyncClient, request: httpx.Request, rec: Record, read: Read = _as_is
) -> Answer:
    response = await http.send(request)
    rec.status = response.status_code
    if response.status_code != 200:
        _http_error(rec, response)
        return Answer()
    answer = read(response.json())
    _usage(rec, answer.get("usage"))
    rec.outcome = "ok"
    choices = answer.get("choices") or [{}]
    return Answer.from_message(choices[0])


def _usage(rec: Record, usage: dict | None) -> None:
    if usage:
        rec.tokens_in = usage.get("prompt_tokens", rec.tokens_in)
        rec.tokens_out = usage.get("completion_tokens", rec.tokens_out)


def _http_error(rec: Record, response: httpx.Response) -> None:
    rec.outcome = f"http_{response.status_code}"
    rec.error = response.text[:200]


def _stream_error(rec: Record, error: object) -> None:
    code = error.get("code") if isinstance(error, dict) else None
    rec.outcome = f"http_{_CODES[code]}" if code in _CODES else "stream_error"
    rec.error = json.dumps(error)[:200]
