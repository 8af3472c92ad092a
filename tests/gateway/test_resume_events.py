"""resume.py's pieces on their own: fields appended to a body (the last of a repeated key wins,
as the server reads it), and the tracker over a replica's events as they arrive in arbitrary
pieces: whole events relayed, token ids kept and stripped unless asked for, a server-side
error event reported and not relayed, a client-side one relayed, nothing after [DONE]."""

import json

import pytest

from kvpilot_gateway.resume import Tracker, with_fields


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
        assert tracker.token_ids == [5, 6, 7] and tracker.done
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
    assert failed and b"error" not in out and tracker.token_ids == [5] and not tracker.done
    tracker.restart()
    bad = {"error": {"message": "m", "type": "invalid_request_error", "code": "bad_request"}}
    out, failed = tracker.feed(_event(bad) + _event("[DONE]"))
    assert not failed and b"bad_request" in out and tracker.done
    assert tracker.feed(_event(_chunk([9], "late")))[0] == b""  # nothing after [DONE]
