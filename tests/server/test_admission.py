"""Issue 17 items 1-2 against a real server: out-of-range sampling parameters fail only
the request that sent them, and the engine keeps serving everyone."""

from tests.server.helpers import GREEDY, healthz, raw, recv_until, send


def _reply(ws, rid=None):
    return recv_until(ws, lambda m: m["type"] in ("error", "finished")
                      and (rid is None or m.get("request_id") == rid))[0]


def test_out_of_range_parameters_fail_only_their_request(make_server):
    server = make_server()
    ws = raw(server.url)
    # the reproduction of issue 17 item 1, byte for byte
    ws.send('{"type":"submit","prompt":"hi","params":{"temperature":1,"seed":18446744073709551616,'
            '"max_tokens":4}}')
    err = _reply(ws)
    assert err["type"] == "error" and err["code"] == "bad_params" and "seed" in err["message"]
    send(ws, type="submit", prompt="hi", params={"temperature": 1, "top_k": 2**63, "max_tokens": 4},
         request_id="k")
    err = _reply(ws, "k")
    assert err["code"] == "bad_params" and "vocabulary" in err["message"]
    # issue 17 item 2: the largest seed with n=2 once overflowed inside the step
    send(ws, type="submit", prompt="hi", params={"temperature": 1, "seed": 2**64 - 1, "n": 2,
                                                 "max_tokens": 4, "ignore_eos": True}, request_id="big")
    fin = _reply(ws, "big")
    assert fin["type"] == "finished" and [len(o["token_ids"]) for o in fin["outputs"]] == [4, 4]
    send(ws, type="submit", prompt="fine", params=GREEDY, request_id="good")
    fin = _reply(ws, "good")
    assert fin["type"] == "finished" and fin["outputs"][0]["finish_reason"] == "length"
    assert healthz(server.port)["status"] == "ready"
    ws.close()
