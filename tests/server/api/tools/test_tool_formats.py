"""The call syntax of each model family, and which one a chat template teaches its model."""

import pytest

from kvpilot_server.api.tools.formats import (
    FORMATS,
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    THINK,
    detect,
    detect_reasoning,
    template_supports_tools,
)

# Excerpts of the families' chat templates, enough of each for what detect() reads.
QWEN25 = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- for tool in tools %}{{- tool | tojson }}"
    "{%- endfor %}{{- '</tools>\\n\\nFor each function call, return a json object with function"
    ' name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\":'
    ' <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>\' }}{%- endif %}'
)
QWEN3 = (
    QWEN25 + "{%- if enable_thinking is defined %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
)
MISTRAL_V3 = (
    '{%- if tools is not none %}{{- "[AVAILABLE_TOOLS] [" }}{%- endif %}'
    '{%- for message in messages %}{%- if message.tool_calls is defined %}{{- "[TOOL_CALLS] [" }}'
    "{%- endif %}{%- endfor %}"
)
LLAMA31 = (
    '{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}'
    '{{- \'Respond in the format {"name": function name, "parameters": dictionary of argument'
    " name and its value}.' }}{%- if builtin_tools is defined %}{{- '<|python_tag|>' }}{%- endif %}"
)
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging"
    " Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' +"
    " message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_each_format_is_registered_under_its_name():
    assert FORMATS == {"hermes": HERMES, "mistral": MISTRAL, "llama3_json": LLAMA3_JSON}


def test_the_trigger_is_the_special_token_that_opens_the_section_or_the_bare_body():
    assert HERMES.trigger == "<tool_call>"
    assert MISTRAL.trigger == "[TOOL_CALLS]"
    assert LLAMA3_JSON.trigger == '{"name"'


def test_sections_are_written_exactly_as_the_families_write_them():
    bodies = [HERMES.body("f", '{"a": 1}'), HERMES.body("g", "{}")]
    assert HERMES.section(bodies) == (
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    )
    bodies = [MISTRAL.body("f", '{"a": 1}'), MISTRAL.body("g", "{}")]
    assert MISTRAL.section(bodies) == (
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]'
    )
    bodies = [LLAMA3_JSON.body("f", '{"a": 1}'), LLAMA3_JSON.body("g", "{}")]
    assert LLAMA3_JSON.section(bodies) == (
        '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}'
    )


def test_a_name_is_written_as_a_json_string():
    assert HERMES.body('say "hi"', "{}") == '{"name": "say \\"hi\\"", "arguments": {}}'


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (QWEN25, HERMES),
        (QWEN3, HERMES),
        (MISTRAL_V3, MISTRAL),
        (LLAMA31, LLAMA3_JSON),
        ('{{ \'Environment: ipython\' }} {"name": ..., "parameters": ...}', LLAMA3_JSON),
        (SMOLLM2, HERMES),  # no tool support: the fallback prompt teaches hermes
        (None, HERMES),
    ],
)
def test_the_format_is_detected_from_the_template(template, expected):
    assert detect(template) is expected


def test_reasoning_tags_are_detected_from_the_template():
    assert detect_reasoning(QWEN3) == THINK
    assert detect_reasoning(QWEN25) is None
    assert detect_reasoning(None) is None


@pytest.mark.parametrize(
    ("template", "supports"),
    [
        (QWEN25, True),
        (MISTRAL_V3, True),
        (LLAMA31, True),
        (SMOLLM2, False),
        (None, False),
        ("", False),
        ("{{ 'Use the tools wisely.' }}{{ messages[0]['content'] }}", False),  # text, no variable
        # transformers' own {% generation %} tag is unknown to plain Jinja: read the text instead
        ("{% generation %}{{ tools | tojson }}{% endgeneration %}", True),
        ("{% generation %}{{ messages }}{% endgeneration %}", False),
    ],
)
def test_tool_support_is_the_template_reading_a_tools_variable(template, supports):
    assert template_supports_tools(template) is supports


def test_the_cli_knows_every_format():
    from kvpilot_server.commands import TOOL_CALL_PARSERS

    assert set(TOOL_CALL_PARSERS) == set(FORMATS)
