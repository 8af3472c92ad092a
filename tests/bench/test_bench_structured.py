"""Structured requests offline: the rules that make an answer valid (one hand-written answer per
failure kind), streamed tool calls and content put together from their deltas, what the client
sends, the structured preset that loads and plans, workloads refused in one line, and the
report's `structured` figures (present only for a workload that sends structured requests)."""

import asyncio
import copy
import json

import httpx
import pytest

from kvpilot_bench import plan as planning
from kvpilot_bench import report as reporting
from kvpilot_bench.client import Endpoint, Record, body, send
from kvpilot_bench.compare import side_by_side
from kvpilot_bench.plan import Planned
from kvpilot_bench.prompts import Corpus, Job, Prompt, jobs
from kvpilot_bench.runner import RunResult
from kvpilot_bench.stats import Slo
from kvpilot_bench.tokens import Counter
from kvpilot_bench.validity import FAILURES, Answer, Reassembly, check
from kvpilot_bench.workload import (
    Distribution,
    RequestClass,
    Variant,
    WorkloadError,
    load,
    parse,
)

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["title", "tags", "level", "score", "slug"],
    "properties": {
        "title": {"type": "string"},
        "tags": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string"}},
        "level": {"enum": ["low", "high"]},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "slug": {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$"},
    },
}
GOOD = {"title": "t", "tags": ["a"], "level": "low", "score": 0.5, "slug": "for-loop"}
LOOKUP = {
    "type": "object",
    "additionalProperties": False,
    "required": ["query", "limit"],
    "properties": {
        "query": {"type": "string", "minLength": 3},
        "limit": {"type": "integer", "minimum": 1, "maximum": 10},
    },
}
TOOLS = (
    {"type": "function", "function": {"name": "lookup", "parameters": LOOKUP}},
    {"type": "function", "function": {"name": "noop"}},  # no parameters: any object
)
SCHEMA_RF = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
JSON_SCHEMA = Variant("schema", "Extract.", response_format=SCHEMA_RF)
JSON_OBJECT = Variant("object", "JSON please.", response_format={"type": "json_object"})
REQUIRED = Variant("required", "Use a tool.", tools=TOOLS, tool_choice="required")
AUTO = Variant("auto", "Maybe a tool.", tools=TOOLS, tool_choice="auto")
NAMED = Variant(
    "named",
    "Look up.",
    tools=TOOLS,
    tool_choice={"type": "function", "function": {"name": "lookup"}},
)
FIXED = Distribution("fixed", {"value": 8.0})


def _call(name, arguments, call_id="call_1"):
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


LOOKUP_OK = _call("lookup", {"query": "for statement", "limit": 3})


@pytest.mark.parametrize(
    ("variant", "answer", "failure"),
    [
        # Valid answers.
        (JSON_SCHEMA, Answer(json.dumps(GOOD), finish_reason="stop"), None),
        (JSON_SCHEMA, Answer(" \n" + json.dumps(GOOD) + "\n"), None),  # JSON allows whitespace
        (JSON_OBJECT, Answer('{"anything": [1, 2]}', finish_reason="stop"), None),
        (REQUIRED, Answer(None, [LOOKUP_OK], "tool_calls"), None),
        (REQUIRED, Answer(None, [LOOKUP_OK, _call("noop", {}, "call_2")], "tool_calls"), None),
        (NAMED, Answer(None, [LOOKUP_OK], "stop"), None),  # OpenAI: stop for a forced call
        (AUTO, Answer("No term here.", [], "stop"), None),  # auto: words are allowed
        (AUTO, Answer(None, [LOOKUP_OK], "tool_calls"), None),
        # Content that is not JSON.
        (JSON_SCHEMA, Answer("Sure! Here is the JSON: {}", finish_reason="stop"), "not_json"),
        (JSON_SCHEMA, Answer("```json\n" + json.dumps(GOOD) + "\n```"), "not_json"),
        (JSON_SCHEMA, Answer(None, [LOOKUP_OK], "tool_calls"), "not_json"),  # no content
        (JSON_OBJECT, Answer('{"x": NaN}'), "not_json"),  # Python's extension, not JSON
        # JSON that does not meet the schema: each kind of constraint.
        (JSON_SCHEMA, Answer(json.dumps({**GOOD, "tags": []})), "schema_mismatch"),
        (JSON_SCHEMA, Answer(json.dumps({**GOOD, "tags": ["a", "b", "c"]})), "schema_mismatch"),
        (JSON_SCHEMA, Answer(json.dumps({**GOOD, "level": "medium"})), "schema_mismatch"),
        (JSON_SCHEMA, Answer(json.dumps({**GOOD, "score": 1.5})), "schema_mismatch"),
        (JSON_SCHEMA, Answer(json.dumps({**GOOD, "slug": "For Loop"})), "schema_mismatch"),
        (JSON_SCHEMA, Answer(json.dumps({**GOOD, "extra": 1})), "schema_mismatch"),
        (JSON_SCHEMA, Answer(json.dumps({"title": "t"})), "schema_mismatch"),  # required
        (JSON_OBJECT, Answer("[1, 2]"), "schema_mismatch"),  # JSON, not an object
        # Tool choice not respected.
        (REQUIRED, Answer("I would rather talk.", [], "stop"), "no_tool_call"),
        (NAMED, Answer("No.", [], "stop"), "no_tool_call"),
        (REQUIRED, Answer(None, [_call("delete_everything", {})], "tool_calls"), "wrong_tool"),
        (NAMED, Answer(None, [_call("noop", {})], "tool_calls"), "wrong_tool"),
        # Arguments that do not parse, or do not meet the tool's parameters.
        (REQUIRED, Answer(None, [_call("lookup", '{"query": "x')], "tool_calls"), "bad_arguments"),
        (REQUIRED, Answer(None, [_call("lookup", {"query": "for", "limit": 99})]),
         "bad_arguments"),
        (AUTO, Answer(None, [_call("lookup", {"query": "no"})]), "bad_arguments"),
        (REQUIRED, Answer(None, [_call("noop", "[]")]), "bad_arguments"),  # not an object
        # Cut by max_tokens: truncated, whatever it holds.
        (JSON_SCHEMA, Answer('{"title": "t", "ta', finish_reason="length"), "truncated"),
        (REQUIRED, Answer(None, [_call("lookup", '{"qu')], "length"), "truncated"),
    ],
)  # fmt: skip
def test_validity_rules(variant, answer, failure):
    found, detail = check(variant, answer)
    assert found == failure, detail
    assert (detail is None) == (failure is None)
    assert failure is None or failure in FAILURES


def test_a_non_streamed_answer_is_read_from_its_message():
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": None, "tool_calls": [LOOKUP_OK]},
        "finish_reason": "tool_calls",
    }
    assert check(REQUIRED, Answer.from_message(choice)) == (None, None)
    assert Answer.from_message({"message": {"content": 7}}).content is None  # not a string
    assert Answer.from_message("nonsense") == Answer()


def _tool_deltas(call_id="call_abc"):
    """Two calls as OpenAI streams them: id, type and name first, then argument fragments."""
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": call_id, "type": "function",
             "function": {"name": "lookup", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"query": "fo'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'r loop", '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"limit": 2}'}}]},
        {"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                         "function": {"name": "noop", "arguments": "{}"}}]},
    ]  # fmt: skip


def test_streamed_tool_calls_are_put_back_together():
    assembly = Reassembly()
    carried = [assembly.add({"index": 0, "delta": d}) for d in _tool_deltas()]
    assembly.add({"index": 0, "delta": {}, "finish_reason": "tool_calls"})
    answer = assembly.answer()
    assert carried == [True, True, True, True, True]  # the name counts as text too
    assert answer.content is None and answer.finish_reason == "tool_calls"
    assert answer.tool_calls == [
        _call("lookup", '{"query": "for loop", "limit": 2}', "call_abc"),
        _call("noop", "{}", "call_2"),
    ]
    assert check(REQUIRED, answer) == (None, None)
    # Content deltas are joined; a role-only delta carries no text.
    assembly = Reassembly()
    assert not assembly.add({"index": 0, "delta": {"role": "assistant", "content": ""}})
    for piece in ('{"any', 'thing": ', "true}"):
        assert assembly.add({"index": 0, "delta": {"content": piece}})
    assembly.add({"index": 0, "delta": {}, "finish_reason": "stop"})
    assert assembly.answer() == Answer('{"anything": true}', [], "stop")
    # A server that leaves out the index: a new id starts a new call.
    assembly = Reassembly()
    for delta in _tool_deltas():
        for fragment in delta["tool_calls"]:
            fragment.pop("index")
        assembly.add({"index": 0, "delta": delta})
    assert [c["function"]["name"] for c in assembly.answer().tool_calls] == ["lookup", "noop"]
    assert check(REQUIRED, assembly.answer()) == (None, None)


def _job(variant: Variant, stream: bool) -> Job:
    cls = RequestClass(
        "s", 1.0, FIXED, FIXED, stream=stream, ignore_eos=False, structured=(variant,)
    )
    planned = Planned(0, 0.0, cls, 8, 8, None, None, 1, variant=0)
    return Job(planned, Prompt(text=f"{variant.instruction}\n\nsome text"), 64, False, 8)


def _sse(*deltas, finish="stop") -> bytes:
    chunks = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    chunks.append({"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 9}})
    lines = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return (lines + "data: [DONE]\n\n").encode()


def _send(job: Job, answer: httpx.Response) -> tuple[Record, dict]:
    seen: dict = {}

    def handler(request):
        seen.update(json.loads(request.content))
        return answer

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            rec = Record(0, "s", job.planned.cls.stream, 0.0)
            await send(http, Endpoint("http://bench.test", "m"), job, rec, timeout_s=5.0)
            return rec

    return asyncio.run(go()), seen


def test_a_streamed_tool_call_is_timed_reassembled_and_checked():
    rec, sent = _send(
        _job(NAMED, stream=True),
        httpx.Response(200, content=_sse(*_tool_deltas()[:4], finish="tool_calls")),
    )
    assert sent["tools"] == list(TOOLS) and sent["tool_choice"] == NAMED.tool_choice
    assert "response_format" not in sent and "ignore_eos" not in sent
    assert rec.outcome == "ok" and rec.variant == "named"
    assert (rec.valid, rec.failure) == (True, None)
    assert rec.ttft is not None and len(rec.itl) == 3  # name, then three argument fragments
    # The same stream, but the model called another tool than the one named.
    deltas = _tool_deltas()[4:]
    rec, _ = _send(_job(NAMED, stream=True), httpx.Response(200, content=_sse(*deltas)))
    assert (rec.valid, rec.failure) == (False, "wrong_tool") and "noop" in rec.failure_detail


def test_streamed_and_whole_json_answers_are_checked():
    pieces = [{"content": c} for c in ('{"title": "t", "tags": ["a"], ', '"level": "low", ',
                                        '"score": 0.5, "slug": "for-loop"}')]  # fmt: skip
    rec, sent = _send(_job(JSON_SCHEMA, True), httpx.Response(200, content=_sse(*pieces)))
    assert sent["response_format"] == SCHEMA_RF and "tools" not in sent
    assert sent["messages"][0]["content"].startswith("Extract.\n\n")
    assert rec.valid and rec.tokens_out == 9
    whole = {
        "choices": [{"index": 0, "message": {"content": '{"title": 1}'}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 5},
    }
    rec, _ = _send(_job(JSON_SCHEMA, False), httpx.Response(200, json=whole))
    assert (rec.outcome, rec.valid, rec.failure) == ("ok", False, "schema_mismatch")
    # A request that did not complete is not checked: its outcome says what happened.
    rec, _ = _send(_job(JSON_SCHEMA, False), httpx.Response(400, json={"error": {}}))
    assert (rec.outcome, rec.variant, rec.valid) == ("http_400", "schema", None)


def test_the_preset_loads_and_plans():
    workload = load("structured")
    classes = {c.name: c for c in workload.classes}
    assert set(classes) == {"extract", "extract-stream", "tools"}
    extract, tools = classes["extract"], classes["tools"]
    assert 4 <= sum(v.response_format["type"] == "json_schema" for v in extract.structured) <= 6
    choices = {
        v.tool_choice if isinstance(v.tool_choice, str) else "named" for v in tools.structured
    }
    assert choices == {"required", "auto", "named"}
    assert all(len(v.tools) >= 2 for v in tools.structured)
    assert not any(c.ignore_eos for c in workload.classes)  # structured answers end themselves
    # The schemas use what the task names: nesting, item counts, enums, ranges, patterns.
    text = json.dumps([v.response_format for v in extract.structured])
    for keyword in ('"minItems"', '"maxItems"', '"enum"', '"minimum"', '"maximum"', '"pattern"'):
        assert keyword in text
    plan = planning.build(workload)
    assert plan == planning.build(workload) and len(plan) > 30
    assert all(p.structured is not None for p in plan)
    drawn = {(p.cls.name, p.structured.name) for p in plan}
    assert {v for c, v in drawn if c == "tools"} == {"required", "auto", "named"}
    # Prompts: the instruction, then the text; the body carries the variant's fields.
    corpus = Corpus(["alpha beta gamma delta " * 20] * 4, [100] * 4)
    made = jobs(plan[:10], corpus, Counter())
    for job in made:
        variant = job.planned.structured
        assert job.prompt.text.startswith(variant.instruction + "\n\n")
        sent = body(job, "m")
        assert ("response_format" in sent) != ("tools" in sent)
        assert "ignore_eos" not in sent and sent["messages"][0]["content"] == job.prompt.text


def test_instructions_take_room_in_the_context():
    workload = load("structured")
    tools_plan = [p for p in planning.build(workload) if p.cls.name == "tools"][:1]
    counter = Counter()
    counter.max_model_len, counter.chat_overhead = 1024, 10
    corpus = Corpus(["word " * 100] * 4, [100] * 4)
    (job,) = jobs(tools_plan, corpus, counter, {("tools", tools_plan[0].structured.name): 700})
    room = 1024 - 10 - 8 - 700  # context, template, join margin, instruction and tools
    assert job.clamped and job.max_tokens == 256 and job.prompt_tokens == room - 256 + 700


def test_structured_draws_leave_other_draws_alone():
    spec = {
        "name": "t",
        "seed": 1,
        "duration_s": 20,
        "arrival": {"process": "poisson", "rate": 5},
        "classes": [
            {
                "name": "a",
                "share": 1,
                "prompt_tokens": {"dist": "uniform", "min": 5, "max": 50},
                "output_tokens": {"dist": "uniform", "min": 5, "max": 50},
            }
        ],
    }
    plain = planning.build(parse(spec))
    structured = copy.deepcopy(spec)
    structured["classes"][0]["structured"] = [
        {"name": "o", "instruction": "JSON.", "response_format": {"type": "json_object"}},
        {"name": "t", "weight": 3, "instruction": "Tool.", "tools": [TOOLS[1]]},
    ]
    with_variants = planning.build(parse(structured))
    assert [(p.at, p.prompt_tokens, p.output_tokens) for p in plain] == [
        (p.at, p.prompt_tokens, p.output_tokens) for p in with_variants
    ]
    names = [p.structured.name for p in with_variants]
    assert 0.6 < names.count("t") / len(names) < 0.9  # weights 1:3


def _structured_spec(**changes):
    variant = {"name": "v", "instruction": "Do it.", "tools": list(TOOLS), **changes}
    return {
        "name": "t",
        "arrival": {"process": "poisson", "rate": 1},
        "classes": [
            {
                "name": "c",
                "share": 1,
                "prompt_tokens": {"dist": "fixed", "value": 10},
                "output_tokens": {"dist": "fixed", "value": 10},
                "structured": [variant],
            }
        ],
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (_structured_spec(tool_choice={"type": "function", "function": {"name": "zap"}}),
         "names 'zap', which is not in tools"),
        (_structured_spec(response_format={"type": "json_object"}), "structured/0"),
        (_structured_spec(tool_choice="none"), "tool_choice"),
        (_structured_spec(tools=[TOOLS[0], TOOLS[0]]), "tool names must differ"),
        (_structured_spec(tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "objekt"}}}]), "tool f: not a JSON schema"),
        ({**_structured_spec(), "classes": [{**_structured_spec()["classes"][0],
                                             "api": "completions"}]},
         "structured needs api: chat"),
        ({**_structured_spec(), "classes": [{**_structured_spec()["classes"][0],
                                             "ignore_eos": True}]},
         "ignore_eos must be false"),
    ],
)  # fmt: skip
def test_bad_structured_workloads_are_refused_in_one_line(spec, message):
    with pytest.raises(WorkloadError) as error:
        parse(spec, "w.yaml")
    text = str(error.value)
    assert text.startswith("w.yaml: ") and message in text and "\n" not in text


def _result(records: list[Record]) -> RunResult:
    return RunResult(
        endpoint=Endpoint("http://127.0.0.1:1", "m", None, "A"),
        workload=load("structured"),
        records=records,
        planned=len(records),
        started_at="2026-12-01T00:00:00+00:00",
        duration_s=10.0,
        interrupted=False,
        token_counter="estimate",
        clamped=0,
    )


def _records() -> list[Record]:
    # (class, variant, outcome, failure): two valid, one of each failure kind, one not checked.
    rows = [
        ("extract", "outline", "ok", None),
        ("extract", "keywords", "ok", "not_json"),
        ("extract", "measure", "ok", "schema_mismatch"),
        ("extract-stream", "outline", "ok", "truncated"),
        ("extract-stream", "keywords", "http_400", None),
        ("tools", "required", "ok", None),
        ("tools", "required", "ok", "no_tool_call"),
        ("tools", "named", "ok", "wrong_tool"),
        ("tools", "auto", "ok", "bad_arguments"),
    ]
    out = []
    for i, (cls, variant, outcome, failure) in enumerate(rows):
        checked = outcome == "ok"
        out.append(
            Record(
                index=i,
                cls=cls,
                stream=cls != "extract",
                sent_at=i * 0.5,
                outcome=outcome,
                status=400 if outcome == "http_400" else 200,
                e2e=0.5,
                tokens_out=10,
                variant=variant,
                valid=(failure is None) if checked else None,
                failure=failure,
                failure_detail=failure and f"why {failure}",
            )
        )
    return out


def test_the_report_has_structured_figures():
    rep = reporting.run_report(_result(_records()), Slo())
    reporting.validate(reporting.document("run", [rep]))
    totals = rep["totals"]["structured"]
    assert (totals["sent"], totals["checked"], totals["valid"]) == (9, 8, 2)
    assert totals["valid_share"] == 0.25
    assert totals["failures"] == dict.fromkeys(FAILURES, 1)
    assert totals["checked"] == totals["valid"] + sum(totals["failures"].values())
    assert totals["variants"]["outline"] == {
        "sent": 2,
        "checked": 2,
        "valid": 1,
        "valid_share": 0.5,
    }
    tools = rep["classes"]["tools"]["structured"]
    assert (tools["checked"], tools["valid"], tools["failures"]["wrong_tool"]) == (4, 1, 1)
    stream = rep["classes"]["extract-stream"]["structured"]
    assert (stream["sent"], stream["checked"], stream["valid_share"]) == (2, 1, 0.0)
    assert rep["requests"][1]["structured"] == {
        "variant": "keywords", "valid": False, "failure": "not_json", "detail": "why not_json"
    }  # fmt: skip
    assert rep["requests"][4]["structured"]["valid"] is None  # a 400: not checked
    text = reporting.table(rep)
    assert "structured" in text and "valid share" in text
    lines = text.splitlines()
    assert any(ln.startswith("all ") and "25.0%" in ln and "truncated 1" in ln for ln in lines)
    assert "valid 25.0%" in reporting.one_line(rep)
    assert "all valid share" in side_by_side([rep, rep])
    # The schema refuses a failure kind it does not know.
    broken = json.loads(json.dumps(reporting.document("run", [rep])))
    broken["runs"][0]["totals"]["structured"]["failures"]["weird"] = 1
    with pytest.raises(Exception, match="weird"):
        reporting.validate(broken)


def test_other_workloads_reports_have_no_structured_figures():
    result = _result([])
    result.workload = load("mixed")
    result.records = [Record(0, "chat", True, 0.0, outcome="ok", e2e=0.1, ttft=0.05, tokens_out=3)]
    rep = reporting.run_report(result, Slo())
    reporting.validate(reporting.document("run", [rep]))
    assert "structured" not in rep["totals"] and "structured" not in rep["classes"]["chat"]
    assert "structured" not in rep["requests"][0]
    assert "structured" not in reporting.table(rep) and "valid" not in reporting.one_line(rep)
