"""The engine thread's one entry, used without a websocket: a second front door (the
OpenAI HTTP API's shape) sends the same protocol ops with its own Sink and gets typed
answers, RequestOutputs included."""

from __future__ import annotations

import pytest

from engine.core.sampling_params import SamplingParams
from engine.protocol import Abort, Accepted, Error, Ok, Ping, ResetPrefixCache, Submit
from engine.server.worker.mailbox import Detach, NewRun, StepOut
from engine.server.worker.sink import Sink
from tests.server.door import ListSink, door, make_door  # noqa: F401 (fixtures)

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
LONG = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)


def test_a_front_door_without_a_websocket(door):
    mailbox, pump, seen = door.mailbox, door.pump, door.seen
    a, b = ListSink(mailbox.new_sink_id()), ListSink(mailbox.new_sink_id())
    assert mailbox.send(a, Submit(prompt="hello there", params=GREEDY, request_id="x"))
    pump(lambda: a.finished("x") is not None)
    assert a.items[0] == Accepted("x")
    outs = a.outputs("x")
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    final = outs[-1].outputs[0]
    assert final.finish_reason == "length" and len(final.token_ids) == 6
    # the deltas add up to the final text and tokens: what a streaming consumer needs
    assert "".join(o.deltas[0][0] for o in outs if 0 in o.deltas) == final.text
    assert sum((list(o.deltas[0][1]) for o in outs if 0 in o.deltas), []) == final.token_ids
    assert not b.items  # nothing of a's reaches another sink
    # the run's first NewRun and its steps went to the subscribers' side, not to sinks
    assert isinstance(seen[0], NewRun) and any(isinstance(d, StepOut) for d in seen)

    # only the submitting sink may abort; an abort ends the stream with reason abort
    assert mailbox.send(a, Submit(prompt="a long one", params=LONG, request_id="long"))
    pump(lambda: Accepted("long") in a.items)
    assert mailbox.send(b, Abort("long"))
    pump(lambda: any(isinstance(i, Error) for i in b.items))
    (err,) = b.items
    assert (err.code, err.request_id, err.op) == ("unknown_request", "long", "abort")
    assert mailbox.send(a, Abort("long"))
    pump(lambda: a.finished("long") is not None)
    assert a.finished("long").outputs[0].finish_reason == "abort"

    assert mailbox.send(b, ResetPrefixCache())
    pump(lambda: any(isinstance(i, Ok) for i in b.items))
    ok = b.items[-1]
    assert ok.op == "reset_prefix_cache" and ok.result["num_blocks_reset"] >= 1

    # a vanished client (Detach) has its live requests aborted
    assert mailbox.send(b, Submit(prompt="nobody reads this", params=LONG, request_id="orphan"))
    pump(lambda: Accepted("orphan") in b.items)
    mailbox.send_lifecycle(b, Detach())
    pump(lambda: b.finished("orphan") is not None)
    assert b.finished("orphan").outputs[0].finish_reason == "abort"

    # ids: a sink's request without an id is named after the sink; refusals are typed
    assert mailbox.send(a, Submit(prompt=[1, 2, 3], params=GREEDY))
    pump(lambda: any(isinstance(i, Accepted) and i.request_id.startswith(f"c{a.id}-")
                     for i in a.items))
    def error(rid=None, op=None):
        return next((i for i in a.items if isinstance(i, Error)
                     and (rid is None or i.request_id == rid) and (op is None or i.op == op)), None)

    assert mailbox.send(a, Submit(prompt="again", params=GREEDY, request_id="x"))
    pump(lambda: error("x") is not None)
    assert error("x").code == "duplicate_request_id"
    assert mailbox.send(a, Submit(prompt="many", params=SamplingParams(n=65), request_id="n"))
    pump(lambda: error("n") is not None)
    assert error("n").code == "bad_params"

    # an op only a front door answers is refused, never executed (and never fatal)
    assert mailbox.send(a, Ping())
    pump(lambda: error(op="ping") is not None)
    assert error(op="ping").code == "unknown_op"


def test_a_sink_must_say_which_front_door_it_is():
    # the engine thread records each request's source from its sink; a sink class without
    # one is refused when it is defined, not when a request of it finishes mid-step
    with pytest.raises(TypeError, match="must set source"):
        class Nameless(Sink):
            def deliver(self, item) -> None:
                pass
    with pytest.raises(TypeError, match="must set source"):
        class Stringly(Sink):
            source = "openai"

            def deliver(self, item) -> None:
                pass
