"""What vLLM-format KV events cost: generation throughput with the publisher on vs off.

"Off" is an engine with its own events on (core events, StepRecord, metrics: what
every served engine does) and no KV event publisher listening. "On" adds the
KVEventsPublisher: its step listener queues each step, and its thread maps, encodes
(msgpack, tagged maps) and sends one batch per step with KV events over ZMQ to a
subscriber in another process that reads everything (a PUB with no subscriber would
send nothing and flatter the figure).

Measured as ``bench/events_cost.py`` measures events: one engine, one workload,
the two modes alternating step by step (off on on off ...), the loss from the median
over adjacent (off, on) pairs of off/on step time. The publisher thread works
asynchronously, partly during the next ("off") step, so all of its CPU seconds are
then charged to "on" as if it ran on the engine's critical path (conservative: it
shares the GIL, but part of its time is spent in ZMQ and the kernel without it).

A control (A/A) pass with the publisher on in both modes measures what the method
reports when nothing differs: on a shared box that noise can exceed the cost itself.

    python -m bench.kv_events_cost [--model smollm2-135m] [--repeats 3] [--control-passes 1] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.events_cost import _median_ratio, _off_on_pairs, _thread_cpu_seconds, alternate
from bench.run_kvscope import make_engine
from bench.workloads import Workload

# Reads the stream until told to stop on stdin (then takes what is still in flight);
# prints the seqs it got as JSON. Steps can be seconds apart on a busy box: no idle timeout.
SUBSCRIBER = """
import json, sys, zmq
sock = zmq.Context.instance().socket(zmq.SUB)
sock.setsockopt(zmq.SUBSCRIBE, b"")
sock.connect(sys.argv[1])
poller = zmq.Poller()
poller.register(sock, zmq.POLLIN)
poller.register(sys.stdin, zmq.POLLIN)
print("ready", flush=True)
seqs, size, stop = [], 0, False
while True:
    ready = dict(poller.poll(500 if stop else None))
    if sock in ready:
        topic, seq, payload = sock.recv_multipart()
        seqs.append(int.from_bytes(seq, "big"))
        size += len(payload)
    elif stop:
        break
    if sys.stdin.fileno() in ready:
        stop = True
        poller.unregister(sys.stdin)
print(json.dumps({"seqs": seqs, "payload_bytes": size}), flush=True)
"""


def _alternating_pass(loaded, model: str, workload: Workload, max_num_seqs: int, num_kv_blocks: int,
                      bar, control: bool = False, **engine_kw) -> dict:
    """One fresh engine, the publisher's listener on in "on" steps only; ``control``: in both
    (an A/A pass: whatever "loss" it shows is the method's noise on this box)."""
    from engine.kv_events.config import KVEventsConfig

    with tempfile.TemporaryDirectory(prefix="kvscope-kvbench-") as tmp:
        endpoint = f"ipc://{Path(tmp) / 'kv.sock'}"
        kv = KVEventsConfig(enable_kv_cache_events=True, endpoint=endpoint)
        engine = make_engine(loaded, model, max_num_seqs, num_kv_blocks, enable_events=True,
                             kv_events_config=kv, **engine_kw)
        pub = engine.kv_events
        sub = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, endpoint], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
        assert sub.stdout.readline().strip() == "ready"
        for _ in range(100):  # until the subscription has surely reached the publisher
            pub.announce_cleared()
            pub.flush()
            time.sleep(0.01)
        first_seq = pub.seq
        listener = pub.on_step
        engine.step_listeners.remove(listener)
        cpu0 = _thread_cpu_seconds(pub._thread.native_id)

        def set_mode(mode: str) -> None:
            engine.step_listeners[:] = [listener] if mode == "on" or control else []

        trace = alternate(engine, workload, set_mode, bar)
        t = time.perf_counter()
        pub.flush(30)
        drain = time.perf_counter() - t
        publisher_cpu = _thread_cpu_seconds(pub._thread.native_id) - cpu0
        stats = pub.stats()
        engine.close()  # sends what is queued
        sub.stdin.write("stop\n")
        sub.stdin.close()
        got = json.loads(sub.stdout.readline())
        sub.wait(30)
    return {"trace": trace, "publisher_cpu": publisher_cpu, "drain": drain,
            "batches": stats["next_seq"] - first_seq, "dropped_steps": stats["dropped_steps"],
            "received": sum(1 for q in got["seqs"] if q >= first_seq), "payload_bytes": got["payload_bytes"]}


def run_kv_events_ab(loaded, model: str, workload: Workload, max_num_seqs: int, num_kv_blocks: int,
                     progress_factory=None, repeats: int = 3, control_passes: int = 0, **engine_kw) -> dict:
    """``repeats`` passes of one fresh engine each, the KV publisher off/on per step; the loss.
    ``control_passes`` A/A passes (publisher on in both modes) measure the method's noise."""
    bar = progress_factory("kv events off/on", repeats * workload.num_output_tokens) if progress_factory else None
    passes = [_alternating_pass(loaded, model, workload, max_num_seqs, num_kv_blocks, bar, **engine_kw)
              for _ in range(repeats)]
    controls = [_alternating_pass(loaded, model, workload, max_num_seqs, num_kv_blocks, None, control=True,
                                  **engine_kw) for _ in range(control_passes)]
    if bar is not None:
        bar.close()
    pairs, busy, cpu = [], {"off": 0.0, "on": 0.0}, {"off": 0.0, "on": 0.0}
    steps = {"off": 0, "on": 0}
    for p in passes:
        for mode, dt, dc, _ in p["trace"]:
            busy[mode] += dt
            cpu[mode] += dc
            steps[mode] += 1
        pairs += _off_on_pairs(p["trace"])
    wall_ratio = _median_ratio(pairs)
    cpu_ratio = statistics.median([off[2] / on[2] for off, on in pairs if on[2] > 0] or [1.0])
    publisher_cpu = sum(p["publisher_cpu"] for p in passes)
    return {
        "workload": workload.description,
        "method": f"{repeats} passes of one fresh engine each, KV event publisher off/on alternating per "
                  "step (off on on off ...), a subscriber process reading everything; the publisher "
                  "thread's CPU charged to 'on'",
        "repeats": repeats,
        "steps": steps,
        "step_seconds": busy,
        "pairs": len(pairs),
        "median_pair_ratio_off_over_on": wall_ratio,
        "loss_engine_thread_per_pass": [1 - _median_ratio(_off_on_pairs(p["trace"])) for p in passes],
        "loss_engine_thread": 1 - wall_ratio,
        "publisher_thread_cpu_s": publisher_cpu,
        "loss": 1 - wall_ratio / (1 + publisher_cpu / busy["on"]),
        "loss_cpu_time": 1 - cpu_ratio / (1 + publisher_cpu / cpu["on"]),
        "batches_published": sum(p["batches"] for p in passes),
        "batches_received": sum(p["received"] for p in passes),
        "payload_bytes": sum(p["payload_bytes"] for p in passes),
        "dropped_steps": sum(p["dropped_steps"] for p in passes),
        "control_passes": control_passes,
        "control_loss_engine_thread": (1 - _median_ratio([x for c in controls for x in _off_on_pairs(c["trace"])])
                                       if controls else None),
    }


def render(r: dict) -> str:
    per_pass = ", ".join(f"{x:.1%}" for x in r["loss_engine_thread_per_pass"])
    return (f"{r['workload']}. {r['method']}; {r['pairs']} adjacent off/on step pairs in all. Engine thread: "
            f"median off/on step time {r['median_pair_ratio_off_over_on']:.3f} "
            f"({r['loss_engine_thread']:.1%} loss; per pass: {per_pass}); with the publisher thread's "
            f"{r['publisher_thread_cpu_s']:.2f} s of CPU charged to on: **{r['loss']:.1%} loss**. From CPU "
            f"seconds instead of wall time: {r['loss_cpu_time']:.1%}. {r['batches_published']} batches "
            f"published during the runs, {r['batches_received']} received by the subscriber "
            f"({r['payload_bytes'] / 1024:.0f} KiB of msgpack), {r['dropped_steps']} steps dropped."
            + (f" Control: {r['control_passes']} A/A pass(es) with the publisher on in both modes show "
               f"{r['control_loss_engine_thread']:.1%}, the method's noise on this box."
               if r.get("control_passes") else ""))


def main(argv: list[str] | None = None) -> int:
    from bench import workloads as W
    from bench.run_kvscope import BASE_ENGINE, warm_up
    from engine.model.loader import load_model
    from engine.engine_core.startup import configure_cpu_threads

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--num-kv-blocks", type=int, default=512)
    p.add_argument("--control-passes", type=int, default=1,
                   help="A/A passes (publisher on in both modes): the noise floor of the method")
    p.add_argument("--json", default=None, help="also write the result here")
    args = p.parse_args(argv)
    configure_cpu_threads()
    loaded = load_model(args.model, device="cpu")
    scale = W.QUICK if args.quick else W.FULL
    max_len = min(BASE_ENGINE["max_model_len"], loaded.spec.max_position_embeddings)
    warm_up(make_engine(loaded, args.model, args.max_num_seqs, -(-max_len // 16) + 8, max_model_len=max_len))
    # the events A/B's workload: the first 2 x max_num_seqs mixed requests, outputs capped
    wl = W.build("mixed", loaded.tokenizer, scale, 0).head(2 * args.max_num_seqs, scale.events_max_tokens)
    r = run_kv_events_ab(loaded, args.model, wl, args.max_num_seqs, args.num_kv_blocks, repeats=args.repeats,
                         control_passes=args.control_passes, max_model_len=max_len)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    print(render(r))
    print(json.dumps({k: v for k, v in r.items() if k != "workload"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
