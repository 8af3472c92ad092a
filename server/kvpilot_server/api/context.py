"""The `truncate-oldest` context policy: drop the oldest turns of a chat until it fits.

System messages always stay, and so does the last turn. Turns go whole: the kept conversation
starts at a user message, because many chat templates reject one that opens with the assistant.
"""

import bisect
from collections.abc import Callable
from typing import Any

Message = dict[str, Any]


def drop_oldest_turns(
    messages: list[Message], fits: Callable[[list[Message]], bool]
) -> tuple[list[Message], int]:
    """The longest suffix of turns (plus every system message) that `fits`, and how many
    messages were dropped. If even the last turn alone does not fit, that is what comes back,
    and the caller's usual overflow check rejects it."""
    if fits(messages):
        return messages, 0
    turns = [i for i, m in enumerate(messages) if m["role"] != "system"]
    # Cut points: drop every non-system message before turns[k], where turns[k] is a user message.
    cuts = [k for k in range(1, len(turns)) if messages[turns[k]]["role"] == "user"]
    if not cuts:
        return messages, 0

    def without(k: int) -> list[Message]:
        dropped = set(turns[:k])
        return [m for i, m in enumerate(messages) if i not in dropped]

    k = cuts[_first_true(len(cuts), lambda i: fits(without(cuts[i])))]
    return without(k), k


def _first_true(n: int, test: Callable[[int], bool]) -> int:
    """The first index in [0, n) where the monotone `test` (False... then True...) holds, or
    n - 1 if none does. Searched from the end, galloping, then bisected: candidates near the
    end keep little of the conversation, so each test costs about one context's worth of
    tokenization instead of the whole (possibly megabytes long) conversation."""
    hi = n - 1
    if not test(hi):
        return hi
    step, lo = 1, hi - 1
    while lo >= 0 and test(lo):
        hi, step = lo, step * 2
        lo = hi - step
    lo = max(lo, -1)  # test(lo) is False (or lo is before the start); test(hi) is True
    return lo + 1 + bisect.bisect_left(range(lo + 1, hi), True, key=test)
