"""Issue 17 item 6: ``restart`` is a privilege. A client's restart is bounded by what
the operator started the server with (pool bytes and blocks, block size, scheduler
width), and the operator can turn it off.

On main at 7416b2c ``{"num_kv_blocks": null}`` grew the 64-block pool below to the CPU
default (1 GiB worth), ``block_size: 1`` and ``max_num_seqs``/``max_num_batched_tokens``
of 10**9 were accepted, and nothing could turn restarts off."""

from __future__ import annotations

from engine.protocol import Error, Ok, Restart
from engine.server.worker.mailbox import NewRun
from tests.server.door import make_door  # noqa: F401 (fixture)


def _restart(door, options: dict):
    sink = door.sink()
    door.mailbox.send(sink, Restart(options))
    door.pump(lambda: any(isinstance(i, (Ok, Error)) for i in sink.items), 60)
    return next(i for i in sink.items if isinstance(i, (Ok, Error)))


def _pool(door) -> tuple[int, int]:
    run = [d for d in door.seen if isinstance(d, NewRun)][-1]
    return run.hello.config["num_blocks"], run.hello.config["block_size"]


def test_restart_never_grows_past_the_started_server(make_door):
    door = make_door()  # 64 blocks of 4 tokens, 64 batched tokens
    refused = {
        "num_kv_blocks": 65, "block_size": 1, "max_num_seqs": 10**9,
        "max_num_batched_tokens": 10**9,
    }
    for key, value in refused.items():
        answer = _restart(door, {key: value})
        assert isinstance(answer, Error) and answer.code == "bad_config", (key, answer)
        assert key in answer.message or "blocks" in answer.message
    # "the default" pool is the started one, not 1 GiB worth
    assert isinstance(_restart(door, {"num_kv_blocks": None}), Ok) and _pool(door) == (64, 4)
    # bigger blocks: the same bytes, so half as many
    assert isinstance(_restart(door, {"block_size": 8, "num_kv_blocks": None}), Ok)
    assert _pool(door) == (32, 8)
    # the limits are the started server's, not the running engine's: back to 64 is fine
    assert isinstance(_restart(door, {"block_size": 4, "num_kv_blocks": 64}), Ok)
    assert _pool(door) == (64, 4)
    assert isinstance(_restart(door, {"max_num_seqs": 4, "max_num_batched_tokens": 32}), Ok)


def test_the_operator_can_turn_restarts_off(make_door):
    door = make_door(client_restart=False)
    answer = _restart(door, {"num_kv_blocks": 32})
    assert isinstance(answer, Error) and (answer.code, answer.op) == ("restart_disabled", "restart")
    assert _pool(door) == (64, 4) and len([d for d in door.seen if isinstance(d, NewRun)]) == 1


def test_serve_has_no_client_restart_flag():
    from engine.cli import build_parser

    args = build_parser().parse_args(["serve", "--no-client-restart"])
    assert args.client_restart is False
    assert build_parser().parse_args(["serve"]).client_restart is True
