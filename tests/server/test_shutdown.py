"""`kvscope serve` as a real process: SIGTERM leaves a complete run in SQLite, exit 0."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

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


def test_sigterm_aborts_live_requests_and_finishes_the_run(tiny_llama, tmp_path):
    db = tmp_path / "runs.sqlite"
    env = {**os.environ, "KVSCOPE_DB": str(db), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("KVSCOPE_TOKEN", None)
    cmd = [sys.executable, "-m", "engine.cli", "serve", "--model", tiny_llama, "--port", "0",
           "--block-size", "4", "--num-kv-blocks", "128", "--max-model-len", "256",
           "--label", "sigterm-test"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    log = []
    try:
        lines = _lines(proc)
        url = None
        while url is None:
            line = lines.get(timeout=90)
            log.append(line)
            m = re.search(r"serving (ws://127\.0\.0\.1:\d+)", line)
            url = m and m.group(1)
        port = int(url.rsplit(":", 1)[1])
        client = KVScopeClient(url, timeout=30)
        client.connect(wait=90)
        assert healthz(port)["status"] == "ready"
        short = client.generate("short one", params=GREEDY)
        rid = client.submit("long one", params={"temperature": 0, "max_tokens": 200, "ignore_eos": True})
        stream = client.stream(rid)
        assert next(stream).type == "output"
        proc.send_signal(signal.SIGTERM)
        fin = None
        try:
            for msg in stream:
                fin = msg
        except ServerError as exc:
            assert exc.code == "closed"
        assert fin is not None and fin.type == "finished"
        assert fin.outputs[0]["finish_reason"] == "abort"
        assert proc.wait(30) == 0
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
