"""resume.py's pieces on their own: fields appended to a body (the last of a repeated key wins,
as the server reads it), and the tracker over a replica's events as they arrive in arbitrary
pieces: whole events relayed, token ids kept and stripped unless asked for, a server-side
error event reported and not relayed, a client-side one relayed, nothing after [DONE]; and what
a broken or hostile replica sends: an endless event, events that are not the server's JSON, and
more token ids than a continuation can carry, each bounded or refused, never a crash."""

import json
import time

import pytest

from kvpilot_common.http.limits import MAX_BODY_BYTES
from kvpilot_gateway.resume import MAX_EVENT_BYTES, Malformed, Tracker, room, with_fields


def _event(body: dict | str) -> bytes:
    return b"data: " + (body if isinstance(body, str) else json.dumps(body)).encode() + b"\n\n"


def _chunk(ids: list[int], text: str, **extra) -> dict:
    choice = {"index": 0, "delta": {"content": text}, "token_ids": ids}
    return {"id": "chatcmpl-1", "created": 7, "choices": [choice], **extra}


STREAM = (
    _event(_chunk([], "", prompt_token_ids=[1, 2]))
    + _event(_chunk([5, 6], "Hel"))
    + _event(_chunk([7], "lo"))
    + _event("[DONE]")
)


def test_fields_are_appended_and_win_over_the_clients_own():
    body = b'{"model": "m", "return_token_ids": false}  \n'
    assert json.loads(with_fields(body, {"return_token_ids": True, "x": [1]})) == {
        "model": "m",
        "return_token_ids": True,
        "x": [1],
    }
    with pytest.raises(ValueError):
        with_fields(b"[1]", {"a": 1})


@pytest.mark.parametrize("piece", [1, 7, len(STREAM)])
def test_events_in_any_pieces_relay_whole_and_without_ids_unless_asked(piece):
    for keep in (False, True):
        tracker, relayed = Tracker(keep_ids=keep), b""
        for start in range(0, len(STREAM), piece):
            out, failed = tracker.feed(STREAM[start : start + piece])
            assert not failed and (not out or out.endswith(b"\n\n"))
            relayed += out
        assert tracker.token_ids.tolist() == [5, 6, 7] and tracker.done
        assert (tracker.id, tracker.created) == ("chatcmpl-1", 7)
        assert tracker.continuation()["kvpilot_continue"]["token_ids"] == [5, 6, 7]
        if keep:
            assert relayed == STREAM
        else:
            assert b"token_ids" not in relayed and relayed.count(b"data: ") == 4
            assert relayed.endswith(b"data: [DONE]\n\n")


def test_a_server_side_error_event_breaks_the_stream_a_client_side_one_does_not():
    draining = {
        "error": {"message": "m", "type": "service_unavailable", "code": "service_unavailable"}
    }
    tracker = Tracker(keep_ids=False)
    out, failed = tracker.feed(_event(_chunk([5], "a")) + _event(draining) + _event("[DONE]"))
    assert failed and b"error" not in out and tracker.token_ids.tolist() == [5] and not tracker.done
    tracker.restart()
    bad = {"error": {"message": "m", "type": "invalid_request_error", "code": "bad_request"}}
    out, failed = tracker.feed(_event(bad) + _event("[DONE]"))
    assert not failed and b"bad_request" in out and tracker.done
    assert tracker.feed(_event(_chunk([9], "late")))[0] == b""  # nothing after [DONE]


def test_an_endless_event_is_cut_at_the_bound_after_the_whole_events_before_it():
    """A replica's event that never ends (finding: 256 MiB cost +510 MiB and 80 s) raises
    Malformed once past MAX_EVENT_BYTES, each read costing its own bytes, not the buffer's."""
    tracker, piece = Tracker(keep_ids=False), b"a" * (1 << 16)
    first = _event(_chunk([5], "a"))
    fed, raised = 0, None
    started = time.perf_counter()
    try:
        tracker.feed(first + b'data: {"choices": [{"delta": {"content": "')
        while fed < 4 * MAX_EVENT_BYTES:
            tracker.feed(piece)
            fed += len(piece)
    except Malformed as exc:
        raised = exc
    assert raised is not None and "longer than 4 MiB" in str(raised)
    assert MAX_EVENT_BYTES - len(piece) <= fed <= MAX_EVENT_BYTES
    assert time.perf_counter() - started < 1.0  # linear: ~64 reads of 64 KiB
    out, failed = Tracker(keep_ids=False).feed(first)
    assert not failed and out.count(b"data: ") == 1


@pytest.mark.parametrize(
    "bad",
    [
        "{bad",  # not JSON
        "[1, 2]",  # not an object
        "[" * 100_000 + "]" * 100_000,  # deeper than the parser goes
        '{"choices": 5}',
        '{"choices": ["x"]}',
        '{"choices": [{"token_ids": "abc"}]}',  # a string would add its characters as ids
        '{"choices": [{"token_ids": [-1]}]}',
        '{"id": "' + "x" * 10_000 + '", "choices": []}',  # carried into every continuation
        '{"created": "soon", "choices": []}',
        '{"id": "' + "\\u00e9" * 100 + '", "choices": []}',  # six bytes a character, written
        '{"created": ' + "9" * 4300 + ', "choices": []}',  # a number no clock reaches
        '{"choices": [{"delta": {}, "x": NaN}]}',  # the client's parser would refuse it
    ],
)
def test_a_malformed_event_raises_with_the_events_before_it_to_relay(bad):
    tracker = Tracker(keep_ids=False)
    with pytest.raises(Malformed) as raised:
        tracker.feed(_event(_chunk([5], "a")) + _event(bad) + _event("[DONE]"))
    assert raised.value.relayed.count(b"data: ") == 1 and b'"content": "a"' in raised.value.relayed
    assert tracker.token_ids.tolist() == [5]


def test_an_error_code_that_is_not_a_string_is_an_error_the_client_reads():
    tracker = Tracker(keep_ids=False)
    odd = {"error": {"message": "m", "type": "x", "code": ["internal_server_error"]}}
    out, failed = tracker.feed(_event(odd))
    assert not failed and b"error" in out


def test_ids_past_what_a_continuation_can_carry_stop_the_resumption_not_the_stream():
    """A flood of token ids (finding: 4M ids became a 27.5 MB continuation) is kept only up to
    the bytes a continuation may carry; then the stream is relayed on, not resumable."""
    tracker = Tracker(keep_ids=False, room=40)  # "1000, " is 6 bytes: six ids fit, not seven
    relayed = b""
    for _ in range(3):
        out, failed = tracker.feed(_event(_chunk([1000, 1001, 1002], "abc")))
        assert not failed
        relayed += out
    assert not tracker.resumable and len(tracker.token_ids) == 0
    assert relayed.count(b'"content": "abc"') == 3 and b"token_ids" not in relayed
    assert tracker.feed(_event("[DONE]"))[0] == b"data: [DONE]\n\n" and tracker.done
    assert room(b"{}") == MAX_BODY_BYTES - 2 - 2 * 256
