"""`kvscope serve` as a real process: SIGTERM leaves a complete run in SQLite, exit 0."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.client import KVScopeClient, ServerError
from engine.store import RunStore
from tests.server.helpers import GREEDY, healthz

REPO = Path(__file__).resolve().parents[2]


def _lines(proc) -> "queue.Queue[str]":
    q: queue.Queue[str] = queue.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _gone(pid: int, timeout: float = 20.0) -> bool:
    """Whether process ``pid`` has ended (or is a zombie) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def _serve(tiny_llama, db, label: str) -> tuple[subprocess.Popen, "queue.Queue[str]", list, str, int]:
    env = {**os.environ, "KVSCOPE_DB": str(db), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("KVSCOPE_TOKEN", None)
    cmd = [sys.executable, "-m", "engine.cli", "serve", "--model", tiny_llama, "--port", "0",
           "--block-size", "4", "--num-kv-blocks", "128", "--max-model-len", "256",
           "--label", label]
    # a session of its own: SIGINT to its process group is what Ctrl-C in a terminal sends
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log: list = []
    lines = _lines(proc)
    url = None
    while url is None:
        line = lines.get(timeout=90)
        log.append(line)
        m = re.search(r"serving (ws://127\.0\.0\.1:\d+)", line)
        url = m and m.group(1)
    return proc, lines, log, url, int(url.rsplit(":", 1)[1])


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c", "group-sigterm"])
def test_sigterm_aborts_live_requests_and_finishes_the_run(tiny_llama, tmp_path, how):
    db = tmp_path / "runs.sqlite"
    proc, lines, log, url, port = _serve(tiny_llama, db, "sigterm-test")
    try:
        client = KVScopeClient(url, timeout=30)
        client.connect(wait=90)
        health = healthz(port)
        assert health["status"] == "ready"
        engine = health["engine"]  # kvscope serve's engine runs in a process of its own
        assert engine["process"] is True and engine["pid"] != proc.pid
        short = client.generate("short one", params=GREEDY)
        rid = client.submit("long one", params={"temperature": 0, "max_tokens": 200, "ignore_eos": True})
        stream = client.stream(rid)
        assert next(stream).type == "output"
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:  # the whole group (a terminal, a service manager): the engine process ignores
            # it, and the server stops it in order
            os.killpg(proc.pid, signal.SIGINT if how == "ctrl-c" else signal.SIGTERM)
        fin = None
        try:
            for msg in stream:
                fin = msg
        except ServerError as exc:
            assert exc.code == "closed"
        assert fin is not None and fin.type == "finished"
        assert fin.outputs[0]["finish_reason"] == "abort"
        assert proc.wait(30) == 0
        assert _gone(engine["pid"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        while True:
            try:
                log.append(lines.get_nowait())
            except Exception:
                break
    store = RunStore(str(db))
    (run,) = store.list_runs()
    assert run["finished_at"] is not None, "".join(log)
    assert run["label"] == "sigterm-test" and run["id"] == client.run_id
    steps = store.load_steps(run["id"])
    assert [s.seq for s in steps] == list(range(len(steps)))
    last_events = [e for s in steps[-2:] for e in s.events]
    assert any(e.type == "request_finished" and e.reason == "abort" for e in last_events)
    reqs = {r["request_id"]: r for r in store.load_requests(run["id"])}
    assert set(reqs) == {short.request_id, rid}
    assert reqs[rid]["outputs"][0]["finish_reason"] == "abort"
    # the recording replays to the engine's final state: an empty pool
    assert store.snapshot_at(run["id"]).requests == {}


def test_a_killed_server_takes_its_engine_process_with_it(tiny_llama, tmp_path):
    proc, _, log, url, port = _serve(tiny_llama, tmp_path / "runs.sqlite", "sigkill-test")
    try:
        KVScopeClient(url, timeout=30).connect(wait=90)
        child = healthz(port)["engine"]["pid"]
        assert not _gone(child, 0.2)
        proc.kill()  # no graceful stop: the child reads EOF on its pipe and ends itself
        proc.wait(30)
        assert _gone(child), "".join(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
