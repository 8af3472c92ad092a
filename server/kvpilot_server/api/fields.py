"""Request fields kvpilot does not take: refused with a 400 that says why, or reported ignored.

Every OpenAI chat/completions field has one answer (the table in docs/api-fields.md): honoured,
honoured with a limit, or refused here. A refused field is one whose effect would change what
the answer means (a modality, a deprecated calling convention, a feature kvpilot lacks); its
harmless values (false, null, text only) pass. A field OpenAI does not define either is ignored,
as OpenAI's own server does, but never silently: the answer names it in a header and the log.
"""

import logging
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from kvpilot_common.errors import InvalidRequestError

IGNORED_HEADER = "X-KVPilot-Ignored-Fields"
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_MAX_NAMED = 16  # a header stays short whatever the body holds
log = logging.getLogger(__name__)


def _off(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {}


def _text_only(value: Any) -> bool:
    return _off(value) or value == ["text"]


def _one(value: Any) -> bool:
    return value is None or value == 1


# field -> (its harmless values, why anything else is refused)
Rule = tuple[Callable[[Any], bool], str]
_COMMON: dict[str, Rule] = {
    "store": (_off, "kvpilot stores no completions"),
    "prediction": (_off, "predicted outputs are not implemented"),
}
REFUSED_CHAT: dict[str, Rule] = {
    **_COMMON,
    "functions": (_off, "`functions` is deprecated by OpenAI: send `tools`"),
    "function_call": (_off, "`function_call` is deprecated by OpenAI: send `tool_choice`"),
    "audio": (_off, "kvpilot serves text models: there is no audio output"),
    "modalities": (_text_only, 'kvpilot serves text models: only ["text"] is possible'),
    "web_search_options": (_off, "kvpilot has no web search"),
    "reasoning_effort": (_off, "reasoning effort is not adjustable on kvpilot's models"),
    "verbosity": (_off, "verbosity is not adjustable on kvpilot's models"),
}
REFUSED_RESPONSES: dict[str, Rule] = {
    "background": (_off, "kvpilot runs no background responses: send the request and wait"),
    "conversation": (_off, "kvpilot keeps no conversations: send previous_response_id"),
    "prompt": (_off, "kvpilot has no stored prompt templates: send instructions and input"),
    "include": (
        _off,
        "kvpilot has no extra output to include (no encrypted reasoning, no "
        "hosted tools' results; logprobs are on chat completions)",
    ),
    "top_logprobs": (_off, "logprobs are served on /v1/chat/completions, not here yet"),
    "max_tool_calls": (
        _off,
        "a limit on tool calls is not implemented: a response makes "
        "the calls its tool_choice and parallel_tool_calls allow",
    ),
    "prediction": (_off, "predicted outputs are not implemented"),
}
REFUSED_COMPLETIONS: dict[str, Rule] = {
    **_COMMON,
    "suffix": (_off, "insertion (a suffix after the completion) is not implemented"),
    "best_of": (_one, "best_of above 1 is not implemented: send n and pick by logprobs"),
}


def check_extras(parsed: BaseModel, refused: dict[str, Rule]) -> list[str]:
    """Refuse a request that sets a refused field; the names of the other unknown fields."""
    extra = parsed.model_extra or {}
    for name, value in extra.items():
        rule = refused.get(name)
        if rule is not None and not rule[0](value):
            raise InvalidRequestError(f"{name} is not supported: {rule[1]}", name)
    ignored = sorted(name for name in extra if name not in refused)
    if ignored:
        log.info("ignored request fields: %s", ", ".join(ignored))
    return ignored


def ignored_header(ignored: list[str]) -> dict[str, str]:
    """The response header naming ignored fields (names that are not plain words are counted,
    not echoed: a header must not carry what a client put in a body)."""
    if not ignored:
        return {}
    named = [n for n in ignored if _NAME.fullmatch(n)][:_MAX_NAMED]
    rest = len(ignored) - len(named)
    return {IGNORED_HEADER: ", ".join(named + ([f"{rest} more"] if rest else []))}
