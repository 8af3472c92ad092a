"""The async engine: concurrent streams, aborts free blocks, one failing request hurts no other."""

import asyncio
import time

import pytest

from kvpilot_common.errors import ContextOverflowError, EngineDeadError, RequestFailedError
from kvpilot_server import SamplingParams
from kvpilot_server.engine.runtime.async_engine import AsyncEngine
from kvpilot_server.engine.runtime.sequence import Sequence


@pytest.fixture
def engine(tiny_llm):
    async_engine = AsyncEngine(tiny_llm.engine).start()
    yield async_engine
    async_engine.shutdown()
    assert not async_engine._thread.is_alive()


async def _collect(engine, prompt, params, **kw) -> tuple[str, list]:
    text, outputs = "", []
    async for out in engine.generate(prompt, params, **kw):
        text += out.outputs[0].delta_text
        outputs.append(out)
    return text, outputs


def test_streams_match_offline_and_aborts_free_blocks(engine, tiny_llm, corpus_ids):
    prompts = [corpus_ids[i : i + 20 + 7 * i] for i in range(6)]
    params = SamplingParams(max_tokens=16, temperature=0.0)

    async def scenario():
        async def cancelled(prompt):
            async for out in engine.generate(prompt, SamplingParams(max_tokens=500)):
                if len(out.outputs[0].token_ids) >= 3:
                    break  # the client goes away mid-stream

        results = await asyncio.gather(
            *(_collect(engine, p, params) for p in prompts),
            *(cancelled(p) for p in prompts[:3]),
        )
        for _ in range(100):  # the abort lands within a step or two
            if engine.engine.pool.num_free == engine.engine.pool.num_blocks:
                break
            await asyncio.sleep(0.01)
        return results[: len(prompts)]

    streamed = asyncio.run(scenario())
    pool = engine.engine.pool
    assert pool.num_free == pool.num_blocks and not engine.engine.requests
    engine.shutdown()  # the offline reference runs on the same engine, from this thread
    offline = [o.outputs[0] for o in tiny_llm.generate(prompts, params)]
    for (text, outputs), expected in zip(streamed, offline, strict=True):
        assert text == expected.text and outputs[-1].outputs[0].token_ids == expected.token_ids
        assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])


def test_bad_request_raises_before_streaming_and_others_continue(engine, corpus_ids):
    async def scenario():
        good = asyncio.create_task(
            _collect(engine, corpus_ids[:10], SamplingParams(max_tokens=20, temperature=0.0))
        )
        with pytest.raises(ContextOverflowError):
            await _collect(engine, corpus_ids[:2000], SamplingParams(max_tokens=10))
        return await good

    _text, outputs = asyncio.run(scenario())
    assert len(outputs[-1].outputs[0].token_ids) == 20


def test_failure_inside_one_request_fails_only_that_request(engine, corpus_ids, monkeypatch):
    real_add = engine.engine.add_request

    def add_with_fault(request_id, *args, **kwargs):
        real_add(request_id, *args, **kwargs)
        if request_id == "faulty":
            detok = engine.engine.requests[request_id].detokenizer
            monkeypatch.setattr(detok, "add", lambda token: 1 / 0)

    monkeypatch.setattr(engine.engine, "add_request", add_with_fault)
    params = SamplingParams(max_tokens=12, temperature=0.0)

    async def scenario():
        good = asyncio.create_task(_collect(engine, corpus_ids[:30], params))
        with pytest.raises(RequestFailedError, match="division by zero"):
            await _collect(engine, corpus_ids[:15], params, request_id="faulty")
        return await good

    _text, outputs = asyncio.run(scenario())
    assert outputs[-1].outputs[0].finish_reason == "length" and engine.alive


def test_shutdown_ends_streams_in_flight_with_a_clear_error(engine, corpus_ids):
    async def scenario():
        stream = engine.generate(corpus_ids[:10], SamplingParams(max_tokens=900, ignore_eos=True))
        first = await anext(stream)
        await asyncio.to_thread(engine.shutdown)
        with pytest.raises(EngineDeadError, match="shut down"):
            async for _ in stream:
                pass
        return first

    assert not asyncio.run(scenario()).finished
    assert (
        not engine.engine.requests and engine.engine.pool.num_free == engine.engine.pool.num_blocks
    )
    with pytest.raises(EngineDeadError):
        asyncio.run(anext(engine.generate([1, 2], SamplingParams())))


def test_stats_seen_from_another_thread_are_never_torn(engine, corpus_ids, monkeypatch):
    """The engine thread publishes a snapshot after each step. Read live instead, the running
    list looks empty while the scheduler sorts it in place (CPython empties a list during a
    sort); a slow sort key widens that window so that a live read would be caught."""
    real_key = Sequence.sort_key

    def slow_key(seq):
        time.sleep(0.001)  # lets the reading thread run mid-sort
        return real_key(seq)

    monkeypatch.setattr(Sequence, "sort_key", slow_key)
    params = SamplingParams(max_tokens=400, ignore_eos=True)

    async def scenario() -> list[int]:
        streams = [engine.generate(corpus_ids[i : i + 12], params) for i in range(4)]
        for stream in streams:
            await anext(stream)  # all four are running from here until they are closed

        def sample() -> list[int]:
            seen = []
            for _ in range(2_000):
                stats = engine.stats
                seen.append(sum(stats.running.values()) + sum(stats.waiting.values()))
            return seen

        seen = await asyncio.to_thread(sample)
        for stream in streams:
            await stream.aclose()
        return seen

    seen = asyncio.run(scenario())
    assert set(seen) == {4}
