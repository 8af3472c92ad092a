"""docs/api-fields.md is the truth about every request field: this reads its table and holds
the server to it, so neither can change without the other."""

import json
import re
from pathlib import Path

import httpx
import pytest

from kvpilot_server.api.fields import IGNORED_HEADER, REFUSED_CHAT, REFUSED_COMPLETIONS
from kvpilot_server.api.protocol import ChatCompletionRequest, CompletionRequest

TABLE = Path(__file__).parents[3] / "docs" / "api-fields.md"
ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
BASE = {
    "chat": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "completions": {"prompt": "Hi", "max_tokens": 2},
}
MODELS = {"chat": ChatCompletionRequest, "completions": CompletionRequest}


def _rows() -> list[dict[str, str]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        field, endpoint, answer, example, _ = cells
        rows.append(
            {"field": field.strip("`"), "endpoint": endpoint, "answer": answer, "example": example}
        )
    return rows


ROWS = _rows()


def _cases(answer: str) -> list[tuple[str, str, str]]:
    out = []
    for row in ROWS:
        if row["answer"] == answer:
            endpoints = ["chat", "completions"] if row["endpoint"] == "both" else [row["endpoint"]]
            out += [(row["field"], endpoint, row["example"].strip("`")) for endpoint in endpoints]
    return out


def test_the_table_is_whole():
    assert len(ROWS) > 40
    assert {r["answer"] for r in ROWS} == {"honoured", "limited", "refused", "ignored"}
    refused = {(f, e) for f, e, _ in _cases("refused")}
    in_code = {(f, "chat") for f in REFUSED_CHAT} | {
        (f, "completions") for f in REFUSED_COMPLETIONS
    }
    assert refused - {("echo", "completions")} == in_code  # echo: refused by its type


@pytest.mark.parametrize(
    ("field", "endpoint"), [(f, e) for f, e, _ in _cases("honoured") + _cases("limited")]
)
def test_honoured_fields_are_declared(field, endpoint):
    assert field in MODELS[endpoint].model_fields


@pytest.mark.parametrize(("field", "endpoint", "example"), _cases("refused"))
def test_refused_fields_answer_400(tiny_server, field, endpoint, example):
    body = {**BASE[endpoint], field: json.loads(example)}
    answer = httpx.post(tiny_server + ROUTES[endpoint], json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == field


@pytest.mark.parametrize(("field", "endpoint", "_"), _cases("ignored"))
def test_ignored_fields_are_named(tiny_server, field, endpoint, _):
    body = {**BASE[endpoint], field: "x" if field != "metadata" else {"k": "v"}}
    answer = httpx.post(tiny_server + ROUTES[endpoint], json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert field in re.split(r",\s*", answer.headers[IGNORED_HEADER])


def test_harmless_values_of_refused_fields_pass(tiny_server):
    body = {**BASE["chat"], "store": False, "modalities": ["text"], "functions": None}
    answer = httpx.post(tiny_server + ROUTES["chat"], json=body, timeout=60)
    assert answer.status_code == 200, answer.text
