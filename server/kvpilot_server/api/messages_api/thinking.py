"""The Messages API's `thinking` field on kvpilot's models: a chat template that reads an
`enable_thinking` variable (Qwen3's convention, and vLLM's for it) is switched by it; one that
thinks without such a switch (DeepSeek-R1's) always thinks; one with no reasoning tags never
does. A request for what the model cannot do is a 400 that says so."""

from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import meta

from kvpilot_common.errors import InvalidRequestError
from kvpilot_server.api.messages_api.request import (
    Thinking,
    ThinkingAdaptive,
    ThinkingDisabled,
)

SWITCH = "enable_thinking"


@dataclass(frozen=True)
class ThinkingSwitch:
    reasons: bool  # the template knows reasoning tags (assistant.ChatTemplate.reasoning)
    switchable: bool  # the template reads `enable_thinking`

    def template_kwargs(self, thinking: Thinking | None) -> dict[str, Any]:
        """The chat template variables that honour `thinking` (adaptive, or absent: the
        template's own default)."""
        if thinking is None or isinstance(thinking, ThinkingAdaptive):
            return {}
        on = not isinstance(thinking, ThinkingDisabled)
        if self.switchable:
            return {SWITCH: on}
        if on and not self.reasons:
            raise InvalidRequestError(
                "thinking: this model does not think (its chat template has no reasoning "
                'tags); send {"type": "disabled"} or leave thinking out',
                "thinking",
            )
        if not on and self.reasons:
            raise InvalidRequestError(
                "thinking: this model always thinks (its chat template has no "
                f"`{SWITCH}` switch); leave thinking out",
                "thinking",
            )
        return {}


def thinking_switch(template: str | None, reasons: bool) -> ThinkingSwitch:
    """Read once at start: whether the template reads `enable_thinking`."""
    if not template:
        return ThinkingSwitch(reasons, False)
    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateSyntaxError:
        return ThinkingSwitch(reasons, False)
    return ThinkingSwitch(reasons, SWITCH in meta.find_undeclared_variables(ast))
