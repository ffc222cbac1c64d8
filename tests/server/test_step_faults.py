"""Issue 17 items 1-2, the engine thread's part: a step that raises fails only the
request that makes it raise, and the engine keeps serving everyone else.

The faults are injected into the runner (a token id that makes ``execute`` raise), so
these tests hold whatever the admission checks catch first. Before the first fix (main
at 7416b2c) the step handler aborted every live request of every sink: ``waiting`` below
ended with ``error``/``abort`` instead of ``finished``/``length``. Before the second
(main at b923685) every request of the failed step failed: ``good`` below, which shares
the step with ``bad``, ended with ``internal``/``abort``; now the engine runs the step's
requests one by one and fails only ``bad`` (engine.engine_core.step_isolation)."""

from __future__ import annotations

from engine.core.sampling_params import SamplingParams
from engine.events.folds.reducer import PoolState
from engine.protocol import Accepted, Error, Snapshot, Submit, TakeSnapshot
from engine.server.worker.mailbox import NewRun, StepOut
from tests.server.door import door, make_door  # noqa: F401 (fixtures)

LONG = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
POISON = 250  # a prompt holding this token id makes the forward raise


def _poison(worker) -> list[list[str]]:
    """Make the engine's forward raise for a batch holding POISON; returns the batches
    it refused (request ids), for the test to check who was in them."""
    runner = worker.engine.engine_core.runner
    execute, refused = runner.execute, []

    def faulty(out, *args, **kwargs):
        if any(POISON in s.token_ids for s in out.scheduled):
            refused.append([s.request_id for s in out.scheduled])
            raise RuntimeError("injected fault")
        return execute(out, *args, **kwargs)

    runner.execute = faulty  # the engine thread is idle (nothing submitted yet)
    return refused


def _outcome(sink, rid: str) -> tuple[str | None, str | None]:
    """(error code or None, finish reason or None) of request ``rid`` at ``sink``."""
    err = next((i.code for i in sink.items if isinstance(i, Error) and i.request_id == rid), None)
    fin = sink.finished(rid)
    return err, fin.outputs[0].finish_reason if fin else None


def _serves_on_and_counts(door, sink, fault: str) -> None:
    """After one failed step that failed one request: the engine keeps serving, and
    says what happened."""
    door.mailbox.send(sink, Submit(prompt=[5, 6, 7], params=LONG, request_id="after"))
    door.pump(lambda: sink.finished("after") is not None)
    assert _outcome(sink, "after") == (None, "length")
    faults = door.board.current.faults
    assert (faults.steps, faults.requests) == (1, 1) and fault in faults.last


def test_a_failing_step_fails_only_its_culprit(make_door):
    # Two sequences run at once: "good" and "bad" share the failing step, "waiting"
    # (a third sink's) waits for a slot and is in no step when it fails.
    door = make_door(engine={"max_num_seqs": 2})
    refused = _poison(door.worker)
    a, b, c = door.sink(), door.sink(), door.sink()
    door.mailbox.send(a, Submit(prompt=[5, 6, 7, 8, 9], params=LONG, request_id="good"))
    door.mailbox.send(b, Submit(prompt=[5, 6, POISON], params=LONG, request_id="bad"))
    door.mailbox.send(c, Submit(prompt=[7, 8, 9], params=LONG, request_id="waiting"))
    door.pump(lambda: all(s.finished(r) for s, r in ((a, "good"), (b, "bad"), (c, "waiting"))))
    assert refused == [["good", "bad"]] + [["bad"]]  # one failed step; then bad alone failed
    assert _outcome(a, "good") == (None, "length")
    assert len(a.finished("good").outputs[0].token_ids) == 20
    assert _outcome(b, "bad") == ("internal", "abort")
    err = next(i for i in b.items if isinstance(i, Error))
    assert (err.op, "injected fault" in err.message) == (None, True)  # no op: not a verdict
    assert _outcome(c, "waiting") == (None, "length")  # untouched by the fault
    assert len(c.finished("waiting").outputs[0].token_ids) == 20
    _serves_on_and_counts(door, a, "injected fault")
    assert door.board.current.to_dict()["step_failures"]["steps"] == 1
    # the published events still rebuild the engine's true state (aborts freed the blocks)
    first = next(d for d in door.seen if isinstance(d, NewRun))
    state = PoolState.from_snapshot(first.snapshot.state)
    for d in door.seen:
        if isinstance(d, StepOut):
            state.apply_step(d.record)
    door.mailbox.send(a, TakeSnapshot())
    door.pump(lambda: any(isinstance(i, Snapshot) for i in a.items))
    snap = next(i for i in a.items if isinstance(i, Snapshot))
    assert state.to_snapshot() == snap.state
    assert all(blk.ref_count == 0 for blk in snap.state.blocks)


def test_a_request_failing_every_step_is_failed_once(door):
    # n=2 with the poison: its sample rows and fork must not keep the fault alive.
    refused = _poison(door.worker)
    a = door.sink()
    door.mailbox.send(a, Submit(prompt=[POISON], params=SamplingParams(n=2, max_tokens=3),
                                request_id="bad"))
    door.pump(lambda: a.finished("bad") is not None)
    assert refused == [["bad"]]
    assert Accepted("bad") in a.items and _outcome(a, "bad") == ("internal", "abort")
    door.mailbox.send(a, Submit(prompt=[3, 4], params=LONG, request_id="next"))
    door.pump(lambda: a.finished("next") is not None)
    assert _outcome(a, "next") == (None, "length") and len(refused) == 1


def test_issue_17_frames_fail_only_their_request(make_server):
    """The frames of issue 17 items 1-2, over a real socket, while another client's
    request runs. On main at 7416b2c the seed of 2**64 wedged the server (the request
    entered the scheduler without sampling state, every later step raised KeyError, no
    new client got a hello) and ``top_k`` = 2**63 overflowed inside the step, whose
    handler then aborted the other client's request too. Now each is refused at
    admission or served, and the other client's request completes."""
    from tests.server.helpers import GREEDY, healthz, raw, recv_until, send

    server = make_server()
    other = raw(server.url)
    send(other, type="submit", prompt="a long one", request_id="long",
         params={"temperature": 0.0, "max_tokens": 40, "ignore_eos": True})
    recv_until(other, lambda m: m["type"] == "output", 10)
    bad = raw(server.url)
    bad.send('{"type":"submit","prompt":"hi","params":{"temperature":1,"seed":18446744073709551616,'
             '"max_tokens":4},"request_id":"big-seed"}')
    send(bad, type="submit", prompt="hi", params={"temperature": 1, "top_k": 2**63, "max_tokens": 4},
         request_id="big-k")
    send(bad, type="submit", prompt="hi", params={"temperature": 1, "seed": 2**64 - 1, "n": 2,
                                                  "max_tokens": 4}, request_id="last-seed")
    answers = {}
    while len(answers) < 3:
        m, _ = recv_until(bad, lambda m: m["type"] in ("error", "finished"), 10)
        answers[m["request_id"]] = m.get("code") or m["outputs"][0]["finish_reason"]
    assert answers["big-seed"] == answers["big-k"] == "bad_params", answers
    fin, _ = recv_until(other, lambda m: m["type"] in ("finished", "error"), 10)
    assert fin["type"] == "finished" and fin["request_id"] == "long"
    assert fin["outputs"][0]["finish_reason"] == "length" and len(fin["outputs"][0]["token_ids"]) == 40
    late = raw(server.url, open_timeout=10)  # a new client gets hello + snapshot (raw checks)
    send(late, type="submit", prompt="after", params=GREEDY, request_id="after")
    fin, _ = recv_until(late, lambda m: m["type"] == "finished", 10)
    assert fin["outputs"][0]["finish_reason"] == "length"
    health = healthz(server.port)
    assert health["status"] == "ready" and "step_failures" not in health  # no step failed
    for ws in (other, bad, late):
        ws.close()


def test_a_fault_outside_the_forward_fails_the_running_requests(door):
    # schedule() itself raises (an engine bug, not a request's forward): there is no
    # forward to rerun piece by piece, so what runs is failed, and serving goes on.
    sched = door.worker.engine.engine_core.scheduler
    schedule, raised = sched.schedule, []

    def faulty():
        r = sched.requests.get("running")
        if r is not None and r.num_output_tokens == 2 and not raised:
            raised.append(True)
            raise RuntimeError("scheduler fault")
        return schedule()

    sched.schedule = faulty  # the engine thread is idle (nothing submitted yet)
    a = door.sink()
    door.mailbox.send(a, Submit(prompt=[5, 6, 7], params=LONG, request_id="running"))
    door.pump(lambda: a.finished("running") is not None)
    assert raised and _outcome(a, "running") == ("internal", "abort")
    assert len(a.finished("running").outputs[0].token_ids) == 2
    _serves_on_and_counts(door, a, "scheduler fault")
