"""The `truncate-oldest` context policy: drop the oldest turns of a chat until it fits.

System messages always stay, and so does the last turn. Turns go whole: the kept conversation
starts at a user message, because many chat templates reject one that opens with the assistant.
"""

import bisect
from collections.abc import Callable

Message = dict[str, str]


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

    # Dropping more never makes the prompt longer, so the first cut that fits is found by bisection.
    best = bisect.bisect_left(cuts, True, key=lambda k: fits(without(k)))
    k = cuts[min(best, len(cuts) - 1)]
    return without(k), k
