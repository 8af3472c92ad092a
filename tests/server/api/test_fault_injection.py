"""An exception raised at each step of handling a request, streaming or not, leaves nothing
behind: no admission slot, no queued or running engine request, no KV block. The next request
is served normally. Faults are injected into the real app and engine with monkeypatch."""

import httpx
import pytest

from kvpilot_server.api import responses
from kvpilot_server.api import serving as serving_module
from kvpilot_server.api.admission import Admission
from kvpilot_server.api.generation import Generation
from kvpilot_server.api.metrics import ServerMetrics
from kvpilot_server.api.protocol import ChatCompletionRequest
from kvpilot_server.engine.runtime.inputs import InputProcessor
from kvpilot_server.engine.runtime.llm_engine import LLMEngine
from tests.server.api.in_process import serve_in_process

BODY = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Tell me about rivers."}],
    "max_tokens": 24,
    "ignore_eos": True,
    "n": 2,
}


class Injected(RuntimeError):
    pass


def _raise(*args, **kwargs):
    raise Injected("injected fault")


async def _araise(*args, **kwargs):
    raise Injected("injected fault")


def _always(real):
    return _araise if real is serving_module.read_body else _raise


def _on_call(number: int):
    """Faults on the number-th call only (mid-stream), else the real thing."""

    def make(real):
        calls = {"n": 0}

        def wrapped(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == number:
                raise Injected("injected fault")
            return real(*args, **kwargs)

        return wrapped

    return make


# (step, object, attribute, make(real) -> replacement): a request's life, in order.
STEPS = [
    ("read body", serving_module, "read_body", _always),
    ("parse", ChatCompletionRequest, "model_validate_json", _always),
    ("chat template", InputProcessor, "chat", _always),
    ("cost limits", Generation, "_choice_params", _always),
    ("admission", Admission, "waiting_if_admitted", _always),
    ("engine submit", LLMEngine, "add_request", _always),
    ("engine step", LLMEngine, "step", _on_call(3)),
    ("first output", responses.Envelope, "chunks", _always),
    ("streaming", responses.Envelope, "chunks", _on_call(4)),
    ("full response", responses.Envelope, "full", _always),
    ("accounting", ServerMetrics, "observe_finished", _always),
]


@pytest.fixture(scope="module")
def served(tiny_dir):
    served = serve_in_process(tiny_dir("llama"), max_waiting=4)
    yield served
    served.stop()


def _call(base: str, stream: bool) -> int | None:
    """The status of a chat request, reading a stream to its end; None if the connection
    broke (a fault after the response started may do that)."""
    try:
        with httpx.stream(
            "POST", f"{base}/v1/chat/completions", json={**BODY, "stream": stream}, timeout=60
        ) as response:
            for _ in response.iter_lines():
                pass
            return response.status_code
    except httpx.HTTPError:
        return None


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(("step", "owner", "name", "make"), STEPS, ids=[s[0] for s in STEPS])
def test_a_fault_at_any_step_leaves_nothing_behind(
    served, monkeypatch, step, owner, name, make, stream
):
    assert served.idle()
    with monkeypatch.context() as patch:
        patch.setattr(owner, name, make(getattr(owner, name)))
        statuses = [_call(served.base, stream) for _ in range(2)]
    assert all(s != 429 for s in statuses), statuses
    assert served.idle(), (
        f"after a fault at {step}: in flight {served.admission.in_flight}, "
        f"engine {served.engine.stats}"
    )
    ok = httpx.post(f"{served.base}/v1/chat/completions", json=BODY, timeout=60)
    assert ok.status_code == 200, ok.text
    assert served.idle()
