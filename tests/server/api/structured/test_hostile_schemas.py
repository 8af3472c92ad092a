"""Hostile constraints (very deep, very wide, huge enums, pathological regexes, long unions)
answer 400 or finish within the compile deadline, while an ordinary chat streaming beside them
keeps its pace: grammars compile off the engine loop and every step's mask work is bounded."""

import statistics
import threading
import time

import httpx

from kvpilot_server.engine.runtime.async_engine import GRAMMAR_DEADLINE_S


def _deep(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


HOSTILE = {
    "deep": {"guided_json": _deep(300)},
    "wide": {
        "guided_json": {
            "type": "object",
            "properties": {f"p{i}": {"type": "integer"} for i in range(3000)},
            "required": [f"p{i}" for i in range(3000)],
        }
    },
    "huge_enum": {"guided_json": {"enum": [f"v{i}" for i in range(9000)]}},
    "regex": {"guided_regex": "(a|aa|a{1,30})*(b{2,50}){2,50}c{100,1000}"},
    "any_of": {
        "guided_json": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {f"k{i}": {"type": "string"}},
                    "required": [f"k{i}"],
                }
                for i in range(500)
            ]
        }
    },
    "grammar": {"guided_grammar": 'start: a\na: a a | "x" | a "y" a'},
}


def test_hostile_constraints_do_not_stall_others(small_server):
    gaps: list[float] = []
    finish: list[str] = []

    def ordinary() -> None:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 300,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream(
            "POST", f"{small_server}/v1/chat/completions", json=body, timeout=120
        ) as r:
            last = None
            for line in r.iter_lines():
                now = time.monotonic()
                if line.startswith("data: ") and last is not None:
                    gaps.append(now - last)
                if '"finish_reason":"length"' in line.replace(" ", ""):
                    finish.append("length")
                last = now

    streamer = threading.Thread(target=ordinary)
    streamer.start()
    time.sleep(0.5)  # the stream is under way
    answers = {}
    for name, body in HOSTILE.items():
        request = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
        started = time.monotonic()
        answer = httpx.post(
            f"{small_server}/v1/chat/completions", json={**request, **body}, timeout=60
        )
        answers[name] = (answer.status_code, time.monotonic() - started)
    streamer.join(120)
    print(answers, f"gaps: median {statistics.median(gaps):.4f} max {max(gaps):.3f} s")
    for name, (status, seconds) in answers.items():
        assert status in (200, 400), name
        assert seconds < GRAMMAR_DEADLINE_S + 5, name
    assert answers["deep"][0] == 400
    assert finish == ["length"]  # the ordinary stream ran to its end
    assert max(gaps) < 2.0, max(gaps)
