"""Serving one completion request: n engine requests, answered as one JSON body or an SSE stream.

Bad input is answered before any streaming starts (the first engine output is awaited first),
so a client sees either a clean 4xx JSON error or a stream, never a stream that breaks.
A client that goes away aborts its engine requests: mid-stream the response's generator is
closed; while a non-streaming request runs, a watcher on the connection cancels the collection.
"""

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kvpilot_common import metric_names as names
from kvpilot_common import trust
from kvpilot_common.errors import InvalidRequestError, OverloadedError
from kvpilot_common.http.auth import ANONYMOUS, Caller, caller
from kvpilot_common.http.errors import from_exception
from kvpilot_server.api import responses
from kvpilot_server.api.access_log import log_request
from kvpilot_server.api.admission import Admission
from kvpilot_server.api.assistant import ChatShape
from kvpilot_server.api.fanout import merge
from kvpilot_server.api.metrics import ServerMetrics
from kvpilot_server.api.protocol import SamplingFields
from kvpilot_server.api.request_scope import exit_stack
from kvpilot_server.engine.runtime.async_engine import AsyncEngine
from kvpilot_server.engine.runtime.sequence import Tenant
from kvpilot_server.outputs import RequestOutput
from kvpilot_server.sampling_params import SamplingParams

Choice = tuple[int, RequestOutput]
CLIENT_CLOSED = 499  # nginx's status for a client that left before the answer


class Completions:
    def __init__(
        self, engine: AsyncEngine, admission: Admission, metrics: ServerMetrics, model: str
    ) -> None:
        self.engine, self.admission, self.metrics, self.model = engine, admission, metrics, model
        self.tokenizer = engine.inputs.tokenizer

    async def serve(
        self,
        request: Request,
        parsed: SamplingFields,
        prompt: list[int],
        chat: bool,
        headers: dict[str, str] | None = None,
        shape: ChatShape | None = None,
        lora: str | None = None,  # the LoRA adapter the request names (api/adapters.py)
    ) -> Response:
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        outputs: list[RequestOutput | None] = [None] * parsed.n
        who = caller(request)
        done = Accounting(request_id, outputs, self.metrics, lora, who)
        # Whatever happens from here on, the request's slots and engine requests are given
        # back when the HTTP exchange ends: they are tied to the request's exit stack.
        resources = exit_stack(request)
        try:
            params = self._choice_params(parsed, len(prompt))
            structured = params[0].structured_outputs
            if structured is not None:  # before queuing: a bad schema is a 400, not a failure
                started = time.perf_counter()
                await self.engine.compile_grammar(structured)
                self.metrics.observe_grammar(structured.kind, time.perf_counter() - started)
            resources.enter_context(self.admission.admit(parsed.n, who.tenant))
            sources = [
                self.engine.generate(
                    prompt,
                    choice,
                    request_id if parsed.n == 1 else f"{request_id}-{i}",
                    parsed.scheduling_class(),
                    lora,
                    Tenant(who.tenant, who.weight),
                )
                for i, choice in enumerate(params)
            ]
            timeout = self.admission.deadline(parsed.timeout)
            stream = self.admission.timed(merge(sources), timeout)
            resources.push_async_callback(stream.aclose)
            first = await anext(stream)
        except Exception as exc:
            response = from_exception(exc)
            rejected = isinstance(exc, InvalidRequestError | OverloadedError)
            done(response.status_code, names.OUTCOME_REJECTED if rejected else names.OUTCOME_ERROR)
            return response
        taken_over = parsed.kvpilot_continue  # the stream keeps its id and created
        response_id = taken_over.id if taken_over else request_id
        if shape is not None:  # tool calls' ids derive from the response's
            shape = dataclasses.replace(shape, request_id=response_id)
        envelope = responses.Envelope(response_id, lora or self.model, chat, shape)
        if taken_over:
            envelope.created = taken_over.created
        to_logprobs = responses.chat_logprobs if chat else responses.completion_logprobs
        wants_logprobs = params[0].logprobs is not None

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
        outputs[first[0]] = first[1]

        async def collect() -> None:
            async for index, output in stream:
                outputs[index] = output

        try:
            if not await unless_client_leaves(request, collect()):
                done(CLIENT_CLOSED, "abort")
                return Response(status_code=CLIENT_CLOSED)
        except Exception as exc:
            response = from_exception(exc)
            done(response.status_code, names.OUTCOME_ERROR)
            return response
        done(200, None)
        finals: list[RequestOutput] = outputs  # type: ignore[assignment] - all finished
        lps = [
            to_logprobs(o.outputs[0].logprobs or [], self.tokenizer) if wants_logprobs else None
            for o in finals
        ]
        if who.trusted:  # the gateway charges the tenant's tokens (kvpilot_common.trust)
            headers = {**(headers or {}), trust.USAGE_HEADER: str(done.tokens())}
        return JSONResponse(envelope.full(finals, lps, parsed.return_token_ids), headers=headers)

    def _choice_params(self, parsed: SamplingFields, prompt_len: int) -> list[SamplingParams]:
        """Each choice's sampling settings, after the per-request cost limits (docs/limits.md):
        the prompt and completion fit the context, and all n choices fit the KV cache at once
        (more would only preempt each other)."""
        params = parsed.engine_params()
        max_tokens = self.engine.inputs.max_tokens(prompt_len, params)
        need, capacity = parsed.n * (prompt_len + max_tokens), self.engine.kv_capacity_tokens
        if need > capacity:
            raise InvalidRequestError(
                f"n={parsed.n} choices of {prompt_len} prompt + {max_tokens} completion tokens "
                f"need {need} tokens of KV cache at once; this server holds {capacity}. "
                "Lower n or max_tokens.",
                "n" if parsed.n > 1 else "max_tokens",
            )
        # Choice i samples with seed + i: reproducible, yet the choices differ.
        seeds = [None if params.seed is None else params.seed + i for i in range(parsed.n)]
        return [dataclasses.replace(params, seed=seed) for seed in seeds]


class Accounting:
    """Metrics per choice (each is an engine request) and one access-log line per request."""

    def __init__(
        self,
        request_id: str,
        outputs: list[RequestOutput | None],
        metrics: ServerMetrics,
        adapter: str | None = None,
        who: Caller = ANONYMOUS,  # whose tokens per minute it charges, whom the log names
        one_prompt: bool = True,  # n choices of one prompt; False: each output its own (embeddings)
    ) -> None:
        self.request_id, self.outputs, self.metrics = request_id, outputs, metrics
        self.adapter, self.who, self.one_prompt = adapter, who, one_prompt

    def tokens(self) -> int:
        """The request's tokens as its tenant's limit counts them, as its usage does."""
        finished = [o for o in self.outputs if o is not None]
        if not finished:
            return 0
        if not self.one_prompt:
            return sum(o.usage.prompt_tokens for o in finished)
        return responses.usage(finished)["total_tokens"]

    def __call__(self, status: int, outcome: str | None) -> None:
        """outcome None: the request completed and each choice counts its own finish reason."""
        reasons = []
        for output in self.outputs:
            reason = outcome or (output and output.outputs[0].finish_reason) or names.OUTCOME_ERROR
            self.metrics.observe_finished(output, reason, self.adapter)
            reasons.append(reason)
        outcome = ",".join(sorted(set(reasons)))
        log_request(self.request_id, status, self.outputs, outcome, self.who.tenant)
        if self.who.charge is not None:
            self.who.charge(self.tokens())


async def unless_client_leaves(request: Request, work: Coroutine[Any, Any, None]) -> bool:
    """Run `work`; if the client disconnects first, cancel it (which closes the engine stream
    it is reading, aborting the requests) and return False. Errors of `work` propagate."""

    async def gone() -> None:
        # The body has been read, so the next ASGI message is the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        return False
    task.result()
    return True


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
