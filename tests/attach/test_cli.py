"""``kvscope attach`` as a user runs it: a subprocess on a publisher, ended by SIGTERM with
nothing lost; its arguments; ``kvscope replay --json`` and the text view of the run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.cli import main
from engine.events.schema.types import KVBlockStored
from engine.store.runs import RunStore
from tests.attach.fake_publisher import FakePublisher, free_port, removed, stored

REPO = Path(__file__).resolve().parents[2]


def test_sigterm_ends_the_run_cleanly_with_every_batch_recorded(tmp_path, capsys):
    pub = FakePublisher()
    db = str(tmp_path / "runs.sqlite")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "attach", "--kv-events", pub.endpoint, "--replay",
         pub.replay_endpoint, "--pod", "gpu-0", "--label", "cli run", "--port", str(port), "--db", db],
        cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        while not re.search(rf"serving ws://127\.0\.0\.1:{port} \(run \S+\)", lines[-1] if lines else ""):
            lines.append(proc.stdout.readline())
            assert lines[-1], "".join(lines)
        pub.wait_subscriber()
        n = 200
        for i in range(n):
            pub.publish([stored([1000 + i], None if i == 0 else 999 + i, [i] * 4, 4)])
        pub.publish([removed([1000])])
        time.sleep(0.3)  # some are still in flight when the signal comes: none may be lost
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        pub.close()
    store = RunStore(db)
    run = store.list_runs()[0]
    assert run["kind"] == "attached" and run["label"] == "cli run" and run["finished_at"]
    recs = store.load_steps(run["id"])
    assert sum(isinstance(e, KVBlockStored) for r in recs for e in r.events) == n
    assert recs[-1].metrics["cached_blocks"] == {"gpu-0": n - 1}

    assert main(["replay", run["id"], "--db", db, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    blocks = out["pods"]["gpu-0"]["cached_blocks"]
    assert len(blocks) == n - 1 and blocks[0] == {"hash": format(1001, "016x"),
                                                  "parent": format(1000, "016x"), "num_tokens": 4}
    assert main(["replay", run["id"], "--db", db, "--step", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pods"]["gpu-0"]["cached_blocks"] == [
        {"hash": format(1000, "016x"), "parent": None, "num_tokens": 4}]
    assert main(["replay", run["id"], "--db", db]) == 0
    text = capsys.readouterr().out
    assert "| attached |" in text and f"pod gpu-0: {n - 1} cached blocks of 4 tokens" in text
    assert main(["runs", "--db", db]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[-6:] == ["attached,", "1", "pod(s)", "-", "cli", "run"]  # pool, model unknown, label
    assert run["model"] is None


@pytest.mark.parametrize("argv, message", [
    (["--replay", "tcp://127.0.0.1:1"], "--replay belongs to a pod"),
    (["--kv-events", "tcp://127.0.0.1:1", "--pod", "a", "--pod", "b"], "--pod given twice"),
    (["--kv-events", "http://x"], "must be a ZMQ endpoint"),
    (["--kv-events", "tcp://127.0.0.1:1", "--kv-events", "tcp://127.0.0.1:1"], "pod names must differ"),
    (["--kv-events", "tcp://127.0.0.1:1", "--tokenizer", "/nonexistent/dir"], "kvscope downloads nothing"),
    (["--kv-events", "tcp://127.0.0.1:1", "--host", "0.0.0.0"], "--allow-remote"),
])
def test_bad_arguments_are_refused_with_the_reason(argv, message, capsys):
    try:
        code = main(["attach", *argv])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def _consecutive_ports(n: int) -> int:
    import socket

    for _ in range(50):
        base = free_port()
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no run of free ports")


def test_a_data_parallel_pod_is_one_pod_per_rank_on_port_plus_rank(tmp_path):
    from engine.attach.commands import options_from_args
    from engine.cli import build_parser
    from tests.attach.helpers import start_attach, wait_until

    base, rbase = _consecutive_ports(2), _consecutive_ports(2)
    args = build_parser().parse_args(
        ["attach", "--kv-events", f"tcp://127.0.0.1:{base}", "--replay", f"tcp://127.0.0.1:{rbase}",
         "--metrics", "http://127.0.0.1:1/metrics", "--pod", "dp", "--data-parallel-size", "2",
         "--kv-events", "tcp://127.0.0.1:1", "--pod", "solo"])
    opts = options_from_args(args)
    assert [(p.pod, p.endpoint, p.replay, p.metrics) for p in opts.pods] == [
        ("dp-dp0", f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{rbase}", "http://127.0.0.1:1/metrics"),
        ("dp-dp1", f"tcp://127.0.0.1:{base + 1}", f"tcp://127.0.0.1:{rbase + 1}", None),
        ("solo", "tcp://127.0.0.1:1", None, None)]
    # each rank's publisher, on its own port: each batch lands on its rank's pod
    ranks = [FakePublisher(endpoint=f"tcp://127.0.0.1:{base + r}", replay=False, dp_rank=r) for r in range(2)]
    srv = start_attach(tmp_path, *opts.pods[:2])
    try:
        for r, pub in enumerate(ranks):
            pub.wait_subscriber()
            pub.publish([stored([10 + r], None, [1, 2, 3, 4], 4)])
        wait_until(lambda: all(srv.worker.state.cached(f"dp-dp{r}") == {format(10 + r, "016x")}
                               for r in range(2)), what="each rank's block on its pod")
    finally:
        srv.stop()
        for pub in ranks:
            pub.close()


@pytest.mark.parametrize("argv, message", [
    (["--kv-events", "ipc:///tmp/x.sock", "--data-parallel-size", "2"], "needs tcp://HOST:PORT endpoints"),
    (["--kv-events", "tcp://127.0.0.1:5557", "--data-parallel-size", "0"], "must be >= 1"),
])
def test_bad_data_parallel_sizes_are_refused(argv, message, capsys):
    assert main(["attach", *argv]) == 2
    assert message in capsys.readouterr().err
