"""Several engine streams as one: how a request with n choices is served.

Each source is pumped by its own task into one queue, so choices interleave as the engine
produces them. The first error ends the merged stream; closing the merged stream (client gone,
deadline, error) cancels the pumps and closes every source, which aborts their engine requests.
"""

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

T = TypeVar("T")
_END = object()


async def merge(streams: list[AsyncGenerator[T, None]]) -> AsyncIterator[tuple[int, T]]:
    """Items of all streams as (position of its stream, item), in arrival order."""
    if len(streams) == 1:  # the common case (n=1): no pump task, no queue hop per token
        try:
            async for item in streams[0]:
                yield 0, item
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[T, None]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
        except Exception as exc:
            await queue.put((index, exc))
        else:
            await queue.put((index, _END))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        open_streams = len(tasks)
        while open_streams:
            index, item = await queue.get()
            if item is _END:
                open_streams -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
