"""How each model family writes tool calls and reasoning: one definition that the parser reads
to split a model's output, the fallback prompt reads to teach the syntax, and a grammar builder
can read to constrain decoding to it. Pure data; no engine, no torch.

Every call body is one JSON object `{"name": "<function>", "<arguments_key>": {...}}`, keys in
that order. What differs between families is the text around the bodies:

- hermes (Hermes 2 Pro, Qwen2.5, Qwen3): each body in `<tool_call>\\n...\\n</tool_call>`, calls
  one per line.
- mistral (Mistral, Mixtral, Nemo): `[TOOL_CALLS][` then the bodies as a JSON list, then `]`.
  `[TOOL_CALLS]` is a special token: the output must be detokenized with special tokens kept.
- llama3_json (Llama 3.1-3.3 JSON tool calling): bare bodies, as the Llama 3.1 template asks
  ("Respond in the format {"name": function name, "parameters": ...}"), joined by `; `. The
  `<|python_tag|>` token that sometimes precedes them is special and skipped by detokenization.
"""

import json
import re
from dataclasses import dataclass

import jinja2
from jinja2 import meta

# The call body's opening, which is the trigger of formats that have no text before the body.
BARE_JSON_TRIGGER = '{"name"'

# A special token at the front of a call section: the model emits it whole, so its appearance
# alone decides that a call section started, whatever whitespace the rest of the opening has.
_SPECIAL_TOKEN = re.compile(r"<[^<>\s]+>|\[[A-Z_]+\]")


@dataclass(frozen=True)
class ToolFormat:
    """The literal text around call bodies. The parser reads whitespace in these loosely (any
    run, or none, matches), so "[TOOL_CALLS] [" parses as well as "[TOOL_CALLS]["; a grammar
    builder should emit them exactly."""

    name: str
    begin: str  # before the first call
    call_begin: str  # before each call
    call_end: str  # after each call
    separator: str  # between two calls (after the first's call_end, before the next's call_begin)
    end: str  # after the last call
    arguments_key: str  # the body's second key: "arguments" or "parameters"

    @property
    def trigger(self) -> str:
        """The text whose appearance in the output starts the call section: the special token
        that opens it ("<tool_call>", "[TOOL_CALLS]"), or, for formats that write bare bodies,
        the body's opening '{"name"'."""
        opening = (self.begin + self.call_begin).strip()
        if not opening:
            return BARE_JSON_TRIGGER
        token = _SPECIAL_TOKEN.match(opening)
        return token.group(0) if token else opening

    def body(self, name: str, arguments_json: str) -> str:
        """One call body as this format writes it (arguments_json: the arguments object's
        JSON text). The fallback prompt and tests build calls with it."""
        return f'{{"name": {json.dumps(name)}, "{self.arguments_key}": {arguments_json}}}'

    def section(self, bodies: list[str]) -> str:
        """Whole call section around the given call bodies, exactly as the model should write
        it."""
        calls = [self.call_begin + body + self.call_end for body in bodies]
        return self.begin + self.separator.join(calls) + self.end


@dataclass(frozen=True)
class ReasoningFormat:
    """Tags around the reasoning at the start of the output (Qwen3, DeepSeek-R1, QwQ)."""

    start: str = "<think>"
    end: str = "</think>"


HERMES = ToolFormat(
    name="hermes",
    begin="",
    call_begin="<tool_call>\n",
    call_end="\n</tool_call>",
    separator="\n",
    end="",
    arguments_key="arguments",
)
MISTRAL = ToolFormat(
    name="mistral",
    begin="[TOOL_CALLS][",
    call_begin="",
    call_end="",
    separator=", ",
    end="]",
    arguments_key="arguments",
)
LLAMA3_JSON = ToolFormat(
    name="llama3_json",
    begin="",
    call_begin="",
    call_end="",
    separator="; ",
    end="",
    arguments_key="parameters",
)

FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HERMES, MISTRAL, LLAMA3_JSON)}

THINK = ReasoningFormat()


def detect(chat_template: str | None) -> ToolFormat:
    """The format a chat template teaches its model, from the template's text. Hermes when the
    template says nothing recognizable: it is what the fallback prompt teaches models whose
    template has no tool support, and its tags are unlikely in ordinary prose."""
    text = chat_template or ""
    if "<tool_call>" in text:
        return HERMES
    if "[TOOL_CALLS]" in text:
        return MISTRAL
    if "<|python_tag|>" in text or ("ipython" in text and '"parameters"' in text):
        return LLAMA3_JSON
    return HERMES


def detect_reasoning(chat_template: str | None) -> ReasoningFormat | None:
    """The reasoning tags a chat template knows of (it strips or opens them), if any."""
    text = chat_template or ""
    return THINK if THINK.start in text or THINK.end in text else None


def template_supports_tools(chat_template: str | None) -> bool:
    """Whether the Jinja template reads a `tools` variable, i.e. renders the request's tools
    itself. Without it the caller puts them in a system turn (fallback.tools_system_prompt)."""
    if not chat_template:
        return False
    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(chat_template)
    except jinja2.TemplateError:
        # Templates may use tags of their runtime's own (transformers' {% generation %}): fall
        # back to the name appearing inside a Jinja block.
        return re.search(r"\{[{%][^}]*\btools\b", chat_template) is not None
    return "tools" in meta.find_undeclared_variables(ast)
