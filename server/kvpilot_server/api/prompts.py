"""Request bodies to prompt token ids. Runs on a worker thread (AsyncEngine.process): chat
templates and tokenization of a large body take seconds. A text that cannot fit the context
whatever its tokens is refused from its length before any of that work."""

from typing import Any, Literal

from kvpilot_server.api.context import drop_oldest_turns
from kvpilot_server.engine.runtime.inputs import InputProcessor, Message

ContextOverflow = Literal["reject", "truncate-oldest"]


def chat_prompt(
    inputs: InputProcessor,
    messages: list[Message],
    room: int | None,
    policy: ContextOverflow,
    tools: list[dict[str, Any]] | None = None,
    variables: dict[str, Any] | None = None,
) -> tuple[list[int], int | None]:
    """The conversation's token ids under the context policy, and how many messages it dropped
    (None: the policy never drops any). tools: for a template that renders them."""
    if policy == "reject":
        inputs.check_length(_chars(messages), room)
        return inputs.chat(messages, tools, variables), None
    need = room or 1

    def fits(kept: list[Message]) -> bool:
        if inputs.min_tokens(_chars(kept)) + need > inputs.max_model_len:
            return False
        return len(inputs.chat(kept, tools, variables)) + need <= inputs.max_model_len

    kept, dropped = drop_oldest_turns(messages, fits)
    inputs.check_length(_chars(kept), room)  # a last turn too long on its own
    return inputs.chat(kept, tools, variables), dropped


def text_prompt(
    inputs: InputProcessor, prompt: str | list[int], max_tokens: int | None
) -> list[int]:
    if isinstance(prompt, str):
        inputs.check_length(len(prompt), max_tokens)
    return inputs.encode(prompt)


def _chars(messages: list[Message]) -> int:
    return sum(len(m["content"] or "") for m in messages)
