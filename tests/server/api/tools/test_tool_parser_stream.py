"""The parser's rules, one at a time: what is sent when, what is held back, and what becomes of
output that is cut off or does not fit the format."""

from kvpilot_server.api.tools.events import (
    CallArguments,
    CallStart,
    Content,
    Message,
    Reasoning,
    ToolCall,
)
from kvpilot_server.api.tools.formats import HERMES, LLAMA3_JSON, MISTRAL, THINK
from kvpilot_server.api.tools.parser import MessageStream, parse


def test_the_name_is_announced_once_whole_and_the_arguments_grow_as_they_arrive():
    stream = MessageStream(HERMES)
    assert stream.feed('<tool_call>\n{"name": "get_wea') == []
    assert stream.feed('ther", "arguments": ') == [CallStart(0, "get_weather")]
    assert stream.feed('{"city": "Pa') == [CallArguments(0, '{"city": "Pa')]
    assert stream.feed('ris}"}}\n</tool_call>') == [CallArguments(0, 'ris}"}')]
    assert stream.close() == []


def test_a_possible_trigger_is_held_back_until_decided():
    stream = MessageStream(HERMES)
    assert stream.feed("Sure.\n<tool_") == [Content("Sure.")]
    assert stream.feed('call>\n{"name": "f", "arguments": {}}') == [
        CallStart(0, "f"),
        CallArguments(0, "{}"),
    ]
    stream = MessageStream(HERMES)
    assert stream.feed("a <tool_") == [Content("a")]
    assert stream.feed("box> b") == [Content(" <tool_box> b")]


def test_the_reasoning_end_tag_is_held_back_until_decided():
    stream = MessageStream(None, THINK)
    assert stream.feed("<think>\nhm </th") == [Reasoning("hm")]
    assert stream.feed("ink>\n\nYes") == [Content("Yes")]
    assert stream.close() == []


def test_whitespace_before_a_call_section_and_after_it_is_dropped():
    text = '\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n\n'
    assert parse(text, HERMES) == Message(None, None, [ToolCall("f", "{}")])


def test_text_after_a_call_section_is_content():
    text = '[TOOL_CALLS][{"name": "f", "arguments": {}}]\nDone.'
    assert parse(text, MISTRAL) == Message("Done.", None, [ToolCall("f", "{}")])


def test_a_later_section_numbers_its_calls_on():
    call = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    stream = MessageStream(HERMES)
    events = stream.feed(f"{call}\nAnd:\n{call}") + stream.close()
    assert [e for e in events if isinstance(e, CallStart)] == [CallStart(0, "f"), CallStart(1, "f")]


def test_a_call_without_arguments_gets_an_empty_object():
    assert parse('{"name": "now"}', LLAMA3_JSON).tool_calls == [ToolCall("now", "{}")]


def test_keys_after_the_arguments_are_skipped():
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}, "id": "x}"}\n</tool_call>'
    assert parse(text, HERMES) == Message(None, None, [ToolCall("f", '{"a": 1}')])


def test_the_parameters_key_is_accepted_for_arguments_and_whitespace_is_free():
    text = '<tool_call>{ "name" : "f" ,\n "parameters" : {"a": [1, {"b": "}"}]} }</tool_call>'
    assert parse(text, HERMES).tool_calls == [ToolCall("f", '{"a": [1, {"b": "}"}]}')]


def test_a_call_cut_off_in_its_arguments_keeps_what_arrived():
    text = 'Hi\n<tool_call>\n{"name": "f", "arguments": {"q": "long'
    assert parse(text, HERMES) == Message("Hi", None, [ToolCall("f", '{"q": "long')])


def test_a_call_cut_off_before_its_name_is_whole_is_dropped():
    assert parse('Hi\n<tool_call>\n{"name": "get_wea', HERMES) == Message("Hi", None, [])
    assert parse("[TOOL_CALLS] [", MISTRAL) == Message(None, None, [])


def test_text_after_a_trigger_that_is_not_a_call_is_content_as_written():
    text = "Hi\n<tool_call>\nnot json\n</tool_call>"
    assert parse(text, HERMES) == Message(text, None, [])
    text = 'A JSON example: {"name": 5}'
    assert parse(text, LLAMA3_JSON) == Message(text, None, [])


def test_a_named_call_that_goes_wrong_stays_and_the_rest_is_content():
    text = '<tool_call>\n{"name": "f", "arguments": 5}'
    assert parse(text, HERMES) == Message("5}", None, [ToolCall("f", "")])


def test_without_a_format_calls_are_content():
    text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert parse(text, None) == Message(text, None, [])


def test_reasoning_opened_by_the_prompt_may_have_its_start_tag_repeated():
    assert parse("plan\n</think>\nok", None, THINK, True) == Message("ok", "plan", [])
    assert parse("<think>plan</think>ok", None, THINK, True) == Message("ok", "plan", [])


def test_an_output_that_ends_while_it_might_still_open_reasoning_is_read_as_is():
    assert parse("<thi", HERMES, THINK) == Message("<thi", None, [])
    assert parse(" \n", HERMES, THINK) == Message(" \n", None, [])
    assert parse(" <thi", HERMES, THINK, True) == Message(None, "<thi", [])
    assert parse("\n", HERMES, THINK, True) == Message(None, None, [])


def test_reasoning_is_only_at_the_start_of_the_output():
    text = "Hi <think>x</think> there"
    assert parse(text, HERMES, THINK) == Message(text, None, [])


def test_reasoning_cut_off_is_all_reasoning():
    assert parse("<think>\nstill thinking\n", HERMES, THINK) == Message(None, "still thinking", [])
    assert parse("still thinking", HERMES, THINK, True) == Message(None, "still thinking", [])


def test_a_trigger_inside_reasoning_is_reasoning():
    text = "<think>I will write <tool_call> next.</think>\n<tool_call>\n"
    text += '{"name": "f", "arguments": {}}\n</tool_call>'
    expected = Message(None, "I will write <tool_call> next.", [ToolCall("f", "{}")])
    assert parse(text, HERMES, THINK) == expected


def test_content_without_calls_is_kept_as_written():
    assert parse("  Paris.\n", HERMES) == Message("  Paris.\n", None, [])
    assert parse("Is 3 < 4? Yes {", LLAMA3_JSON) == Message("Is 3 < 4? Yes {", None, [])


def test_feeding_after_close_is_ignored():
    stream = MessageStream(HERMES)
    assert stream.close() == []
    assert stream.feed("late") == []
