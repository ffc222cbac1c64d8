"""The engine thread's one entry, used without a websocket: a second front door (the
OpenAI HTTP API's shape) sends the same protocol ops with its own Sink and gets typed
answers, RequestOutputs included."""

from __future__ import annotations

import queue
import time

import pytest

from engine.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.outputs import RequestOutput
from engine.protocol import Abort, Accepted, Error, Ok, Ping, ResetPrefixCache, Submit
from engine.server.engine_loop import EngineWorker
from engine.server.health import HealthBoard, Status
from engine.server.mailbox import Detach, Mailbox, NewRun, Reply, Shutdown, StepOut
from engine.server.sink import Sink, Source
from tests.server.conftest import ENGINE

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
LONG = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)


class ListSink(Sink):
    """What an HTTP request's handler would hold: the answers, in order."""

    source = Source.OPENAI

    def __init__(self, sink_id: int) -> None:
        self.id = sink_id
        self.items: list = []

    def deliver(self, item) -> None:
        self.items.append(item)

    def outputs(self, rid: str) -> list[RequestOutput]:
        return [i for i in self.items if isinstance(i, RequestOutput) and i.request_id == rid]

    def finished(self, rid: str) -> RequestOutput | None:
        return next((o for o in self.outputs(rid) if o.finished), None)


@pytest.fixture
def door(tiny_llama):
    """An engine thread and its mailbox, with deliveries applied on this thread."""
    mailbox = Mailbox(64)
    batches: queue.SimpleQueue = queue.SimpleQueue()
    board = HealthBoard("llama")
    worker = EngineWorker(EngineConfig(model=tiny_llama, **ENGINE), batches.put, mailbox, board)
    worker.start()
    deadline = time.monotonic() + 60
    while board.current.status is Status.LOADING:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert board.current.status is Status.READY
    seen: list = []

    def pump(done, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            batch = batches.get(timeout=max(0.01, deadline - time.monotonic()))
            for d in batch:
                seen.append(d)
                if isinstance(d, Reply):
                    d.sink.deliver(d.item)

    yield mailbox, pump, seen
    mailbox.send_lifecycle(None, Shutdown())
    worker.join(30)
    assert not worker.is_alive()


def test_a_front_door_without_a_websocket(door):
    mailbox, pump, seen = door
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
