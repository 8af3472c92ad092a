"""The generation core every API shares: a request's n engine requests admitted and started
(cost limits, grammar compiled, slots taken), read to the end unless the client leaves, and
accounted once (metrics per choice, one access-log line, the tenant's tokens charged). Each
API renders the outputs in its own wire shape (completions.py, responses_api/, messages_api/).
"""

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kvpilot_common import metric_names as names
from kvpilot_common.errors import InvalidRequestError, OverloadedError
from kvpilot_common.http.auth import ANONYMOUS, Caller, caller
from kvpilot_common.http.errors import from_exception
from kvpilot_server.api import responses
from kvpilot_server.api.access_log import log_request
from kvpilot_server.api.admission import Admission
from kvpilot_server.api.fanout import merge
from kvpilot_server.api.metrics import ServerMetrics, api_of
from kvpilot_server.api.protocol import SamplingFields
from kvpilot_server.api.request_scope import exit_stack
from kvpilot_server.engine.runtime.async_engine import AsyncEngine
from kvpilot_server.engine.runtime.sequence import Tenant
from kvpilot_server.outputs import RequestOutput
from kvpilot_server.sampling_params import SamplingParams

Choice = tuple[int, RequestOutput]
CLIENT_CLOSED = 499  # nginx's status for a client that left before the answer


class Generation:
    def __init__(self, engine: AsyncEngine, admission: Admission, metrics: ServerMetrics) -> None:
        self.engine, self.admission, self.metrics = engine, admission, metrics

    async def start(
        self,
        request: Request,
        parsed: SamplingFields,
        prompt: list[int],
        request_id: str,
        lora: str | None = None,  # the LoRA adapter the request names (api/adapters.py)
    ) -> "Run":
        """The request's n engine requests admitted and running, their first output in. An
        error before that (a bad schema, no room, the engine's refusal) is counted and raised:
        each API answers it in its own shape."""
        outputs: list[RequestOutput | None] = [None] * parsed.n
        who = caller(request)
        api = api_of(request.url.path)
        done = Accounting(request_id, outputs, self.metrics, api, lora, who)
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
            status = from_exception(exc).status_code
            rejected = isinstance(exc, InvalidRequestError | OverloadedError)
            done(status, names.OUTCOME_REJECTED if rejected else names.OUTCOME_ERROR)
            raise
        outputs[first[0]] = first[1]
        return Run(first, stream, outputs, done, params[0].logprobs is not None)

    async def finish(self, request: Request, run: "Run") -> Response | None:
        """Collect a non-streamed run to its end; an error response, or None once every
        output is in `run.outputs` (and counted)."""

        async def collect() -> None:
            async for index, output in run.rest:
                run.outputs[index] = output

        try:
            if not await unless_client_leaves(request, collect()):
                run.done(CLIENT_CLOSED, "abort")
                return Response(status_code=CLIENT_CLOSED)
        except Exception as exc:
            response = from_exception(exc)
            run.done(response.status_code, names.OUTCOME_ERROR)
            return response
        run.done(200, None)
        return None

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


@dataclass
class Run:
    """A request's engine requests under way: the first output, the rest to read, every
    choice's latest output, and the accounting that closes it."""

    first: Choice
    rest: AsyncIterator[Choice]
    outputs: list[RequestOutput | None]
    done: "Accounting"
    logprobs: bool  # the request asked for them


class Accounting:
    """Metrics per choice (each is an engine request) and one access-log line per request."""

    def __init__(
        self,
        request_id: str,
        outputs: list[RequestOutput | None],
        metrics: ServerMetrics,
        api: str,  # metrics.api_of() the request's path
        adapter: str | None = None,
        who: Caller = ANONYMOUS,  # whose tokens per minute it charges, whom the log names
        one_prompt: bool = True,  # n choices of one prompt; False: each output its own (embeddings)
    ) -> None:
        self.request_id, self.outputs, self.metrics = request_id, outputs, metrics
        self.api, self.adapter, self.who, self.one_prompt = api, adapter, who, one_prompt

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
            self.metrics.observe_finished(output, reason, self.api, self.adapter)
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
