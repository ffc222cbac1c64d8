"""The request-id rule (engine.core.ids) and both places that apply it."""

import pytest

from engine.core.ids import MAX_REQUEST_ID_LEN, RequestIdError, check_request_id
from engine.protocol.codec import parse_op
from engine.protocol.errors import ErrorCode, ProtocolError

GOOD = ["a", "req-0", "c1-2", "cmpl-3f2a9b", "user:42/run_1", "ab+/cd==", "x.y_z@host",
        "0" * MAX_REQUEST_ID_LEN, "r-" + "f" * 12]
BAD = {
    "x\ud800": "may only use",  # a lone surrogate: SQLite could never store it
    "": "1..128 characters",
    "a" * (MAX_REQUEST_ID_LEN + 1): "1..128 characters, got 129",
    "a#1": "may only use",  # '#' names fork samples
    "a b": "may only use",
    "line\nbreak": "may only use",
    "tab\t": "may only use",
    'quo"te': "may only use",
    "back\\slash": "may only use",
    "café": "may only use",
    "\x00": "may only use",
}


@pytest.mark.parametrize("rid", GOOD)
def test_good_ids_pass_unchanged(rid):
    assert check_request_id(rid) is rid


@pytest.mark.parametrize("rid", list(BAD))
def test_bad_ids_get_a_clear_error(rid):
    with pytest.raises(RequestIdError, match=BAD[rid]) as err:
        check_request_id(rid)
    msg = str(err.value)
    assert msg.isascii() and msg.isprintable()  # safe to log and to send back as JSON
    assert len(msg) < 200  # never echoes a megabyte id back


@pytest.mark.parametrize("rid", [None, 7, ["a"], {"a": 1}])
def test_non_strings_are_refused(rid):
    with pytest.raises(RequestIdError, match="must be a string"):
        check_request_id(rid)


def test_the_protocol_applies_the_rule_to_submit_and_abort():
    frame = '{"type": "submit", "prompt": "hi", "request_id": "x\\ud800"}'
    with pytest.raises(ProtocolError) as err:
        parse_op(frame)
    assert err.value.code == ErrorCode.BAD_REQUEST and err.value.op == "submit"
    assert "may only use the characters" in err.value.message and err.value.request_id is None
    with pytest.raises(ProtocolError, match="1..128 characters"):
        parse_op('{"type": "abort", "request_id": ""}')
    assert parse_op('{"type": "submit", "prompt": "hi", "request_id": "cmpl-1:a/b"}').request_id == \
        "cmpl-1:a/b"
    assert parse_op('{"type": "submit", "prompt": "hi"}').request_id is None  # the server names it
