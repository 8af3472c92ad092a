"""The engine behind an asyncio server: the step loop runs in its own thread.

Callers talk to the loop through an inbox (add, abort); outputs come back on one asyncio queue
per request. Only the loop thread touches engine state, so the engine needs no locks; it
publishes an immutable stats snapshot after each step for everyone else. A consumer that stops
iterating (client gone, timeout, cancellation) aborts its request, and the abort frees its KV
blocks before the next step. Prompt processing (templates, tokenization) runs on a small pool
of worker threads: on the event loop it would stall every connection, on the engine thread
every sequence.
"""

import asyncio
import contextlib
import ctypes
import ctypes.util
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kvpilot_common.errors import (
    EngineDeadError,
    InvalidRequestError,
    RequestFailedError,
    UnavailableError,
)
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.runtime.inputs import InputProcessor
from kvpilot_server.engine.runtime.llm_engine import EngineStats, LLMEngine
from kvpilot_server.engine.runtime.sequence import ANONYMOUS, Priority, Tenant
from kvpilot_server.engine.structured.grammar import Grammar
from kvpilot_server.outputs import RequestOutput
from kvpilot_server.pooling_params import PoolingParams
from kvpilot_server.sampling_params import SamplingParams, StructuredOutputsParams

log = logging.getLogger(__name__)
_IDLE_WAIT_S = 0.05
# Two workers: a second long prompt need not wait for the first, and on a small machine the
# engine thread keeps a core.
_INPUT_WORKERS = 2
# Seconds a structured-output constraint may take to compile (docs/limits.md); llguidance's
# parser limits stop most runaway grammars well before it.
GRAMMAR_DEADLINE_S = 10.0
T = TypeVar("T")
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None)


class AsyncEngine:
    def __init__(self, engine: LLMEngine | Callable[[], LLMEngine]) -> None:
        """Wrap an engine, or a function that builds one on the loop thread (see from_config)."""
        self._build = engine if callable(engine) else None
        self.engine: LLMEngine = None if callable(engine) else engine  # type: ignore[assignment]
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._built = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="kvpilot-engine", daemon=True)
        self._workers = ThreadPoolExecutor(_INPUT_WORKERS, thread_name_prefix="kvpilot-inputs")
        # Apart from the input workers: a slow grammar must not hold up tokenizing.
        self._grammar_workers = ThreadPoolExecutor(
            _INPUT_WORKERS, thread_name_prefix="kvpilot-grammars"
        )
        self.error: BaseException | None = None  # set if the loop itself died
        self.stats: EngineStats  # the latest snapshot, replaced (never changed) by the loop

    @classmethod
    def from_config(cls, config: EngineConfig) -> "AsyncEngine":
        """The engine is built on the thread that will step it. Measured on CPU: once the main
        thread has run torch's OpenMP work (loading, warm-up), every step on another thread is
        ~1.7x slower (batch-1 decode 52 -> 80 ms/token), as the idle team competes."""
        return cls(lambda: LLMEngine(config))

    def start(self) -> "AsyncEngine":
        """Start the loop; returns once the engine is built, or raises why it could not be."""
        self._thread.start()
        self._built.wait()
        if self.engine is None:
            self._thread.join()
            raise self.error or RuntimeError("the engine could not be built")
        return self

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._grammar_workers.shutdown(wait=False, cancel_futures=True)

    @property
    def inputs(self) -> InputProcessor:
        """Read-only after start: safe from any thread (see process())."""
        return self.engine.inputs

    @property
    def task(self) -> str:
        """What the model serves: generate or embed (engine/runtime/pooling.py)."""
        return self.engine.task

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV cache holds: a bound on what one request's choices may need at once."""
        return self.num_blocks * self.engine.pool.block_size

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def num_blocks(self) -> int:
        return self.engine.pool.num_blocks

    @property
    def max_num_seqs(self) -> int:
        return self.engine.config.max_num_seqs

    async def process(self, fn: Callable[..., T], *args: Any) -> T:
        """Run CPU-heavy input work (fn(*args), e.g. on self.inputs) on a worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._workers, _trimmed, fn, *args)

    async def compile_grammar(self, spec: StructuredOutputsParams) -> Grammar:
        """Compile a structured-output constraint off the engine thread, under a deadline: a
        hostile schema costs its own request a 400, and never the engine loop its pace. The
        spec keeps the result, so adding the request compiles nothing."""
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._grammar_workers, self.engine.grammars.compile, spec)
        try:
            return await asyncio.wait_for(asyncio.shield(work), GRAMMAR_DEADLINE_S)
        except TimeoutError:
            raise InvalidRequestError(
                f"The {spec.source} did not compile within {GRAMMAR_DEADLINE_S:g} s; "
                "simplify it (docs/limits.md)",
                spec.source,
            ) from None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # -- caller side (event loop) -------------------------------------------------------------

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | PoolingParams,
        request_id: str | None = None,
        priority: Priority = Priority.INTERACTIVE,
        lora: str | None = None,  # a loaded adapter's name
        tenant: Tenant = ANONYMOUS,
    ) -> AsyncIterator[RequestOutput]:
        """Outputs of one request as they come; raises bad-input errors before the first one."""
        if not self.alive:
            raise EngineDeadError("The engine loop is not running")
        request_id = request_id or f"req-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        try:
            await self._call(
                loop, self._add, request_id, prompt, params, (priority, lora, tenant), loop, outputs
            )
        except asyncio.CancelledError:
            self.abort(request_id)  # the add may already have happened
            raise
        finished = False
        try:
            while not finished:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    raise item
                # The request's own fault (a 400), or the server's going away (a 503): as is.
                if isinstance(item.error, InvalidRequestError | UnavailableError):
                    raise item.error
                if item.error is not None:
                    raise RequestFailedError(f"Request {request_id} failed: {item.error}")
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    async def load_adapter(self, name: str, path: str) -> None:
        """Read and check a LoRA adapter on a worker thread, then add it on the engine's."""
        adapter = await self.process(self.engine.read_adapter, name, path)
        await self._call(
            asyncio.get_running_loop(), self._changed, self.engine.add_adapter, adapter
        )

    async def unload_adapter(self, name: str) -> None:
        await self._call(
            asyncio.get_running_loop(), self._changed, self.engine.remove_adapter, name
        )

    def _changed(self, change: Callable[[Any], None], arg: Any) -> None:
        """Apply a change of the adapters and publish the stats that list them at once."""
        change(arg)
        self.stats = self.engine.stats()

    def abort(self, request_id: str) -> None:
        self._submit(lambda: self._abort(request_id))

    def fail_in_flight(self, error: UnavailableError) -> None:
        """End every request in flight with `error` (the server's drain ran out of time): each
        stream ends with it in OpenAI's shape instead of being cut mid-body."""

        def fail() -> None:
            for output in self.engine.fail_all(error):
                self._deliver(output)

        self._submit(fail)

    async def _call(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any
    ) -> None:
        """Run fn(*args) on the engine thread and wait until it has; raises what it raised."""
        future = loop.create_future()

        def run() -> None:
            try:
                fn(*args)
            except Exception as exc:
                loop.call_soon_threadsafe(_settle, future, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, None)

        self._submit(run)
        await future

    def _submit(self, fn: Callable[[], None]) -> None:
        self._inbox.put(fn)
        self._wake.set()

    # -- engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self._build is not None:
                self.engine = self._build()
        except BaseException as exc:  # start() re-raises it on the caller's thread
            self.error = exc
            return
        finally:
            if self.engine is not None:
                self.stats = self.engine.stats()
            self._built.set()
        try:
            self._loop()
        finally:
            self.engine.close()  # tensor-parallel workers: stopped from the thread that steps

    def _add(self, request_id, prompt, params, whose, loop, outputs) -> None:
        priority, lora, tenant = whose
        self.engine.add_request(request_id, prompt, params, priority, lora=lora, tenant=tenant)
        self._streams[request_id] = (loop, outputs)

    def _abort(self, request_id: str) -> None:
        output = self.engine.abort_request(request_id)
        if output is not None:
            self._deliver(output)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._drain_inbox()
                if not self.engine.has_unfinished_requests():
                    self.stats = self.engine.stats()
                    self._wake.wait(_IDLE_WAIT_S)
                    self._wake.clear()
                    continue
                try:
                    outputs = self.engine.step()
                except Exception as exc:  # an engine bug: fail what is in flight, keep serving
                    log.exception("engine step failed outside any request")
                    outputs = self.engine.fail_all(exc)
                self.stats = self.engine.stats()
                for output in outputs:
                    self._deliver(output)
        except BaseException as exc:
            self.error = exc
            log.critical("engine loop died", exc_info=exc)
            self._close_streams(EngineDeadError(f"The engine loop died: {exc}"))
            raise
        # Shut down with requests in flight: their consumers must not wait forever.
        self._drain_inbox()
        self._close_streams(EngineDeadError("The engine was shut down"))

    def _close_streams(self, error: EngineDeadError) -> None:
        for request_id in list(self._streams):
            # Best effort: after a crash the engine's own state may be what is broken.
            with contextlib.suppress(Exception):
                self.engine.abort_request(request_id)
            loop, outputs = self._streams.pop(request_id)
            with contextlib.suppress(RuntimeError):  # that caller's event loop is already closed
                loop.call_soon_threadsafe(outputs.put_nowait, error)

    def _drain_inbox(self) -> None:
        while True:
            try:
                fn = self._inbox.get_nowait()
            except queue.Empty:
                return
            fn()

    def _deliver(self, output: RequestOutput) -> None:
        stream = (
            self._streams.pop(output.request_id, None)
            if output.finished
            else self._streams.get(output.request_id)
        )
        if stream is not None:
            loop, outputs = stream
            try:
                loop.call_soon_threadsafe(outputs.put_nowait, output)
            except RuntimeError:  # the caller's event loop is closed: nobody is listening
                self.engine.abort_request(output.request_id)


def _trimmed(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args), then hand freed heap back to the OS. Tokenizing megabytes allocates hundreds
    of MiB in the worker thread's malloc arena, which glibc otherwise keeps for good: four
    large /tokenize calls left the process 0.5 GiB bigger. A trim with nothing to free costs
    microseconds."""
    try:
        return fn(*args)
    finally:
        if hasattr(_LIBC, "malloc_trim"):  # glibc only
            _LIBC.malloc_trim(0)


def _settle(future: asyncio.Future, exc: Exception | None) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(None)
