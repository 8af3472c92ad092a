"""Schema-driven fuzzing with schemathesis over the live server's /openapi.json: valid bodies and
deliberately invalid ones for every operation. No 5xx, invalid bodies are rejected with 4xx, and
every answer has a content type the document declares."""

import httpx
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, negative_data_rejection

from kvpilot_server.api.openapi import openapi_document

# Built at import, as schemathesis wants; the first test proves the server serves this document.
schema = schemathesis.openapi.from_dict(openapi_document("tiny"))


def test_openapi_describes_every_route(tiny_server):
    document = httpx.get(f"{tiny_server}/openapi.json").json()
    assert document == openapi_document("tiny")
    assert document["openapi"].startswith("3.")
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize"} <= set(
        document["paths"]
    )
    chat = document["components"]["schemas"]["ChatCompletionRequest"]
    assert {"messages", "max_tokens", "stream", "n", "seed"} <= set(chat["properties"])


@schema.parametrize()
@settings(
    max_examples=20,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api_never_fails_on_generated_input(case, tiny_server):
    case.call_and_validate(
        base_url=tiny_server,
        checks=[not_a_server_error, negative_data_rejection, content_type_conformance],
        timeout=60,
    )
