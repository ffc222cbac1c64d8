"""AttachWorker: the thread that turns a deployment's KV event streams into one run.

It plays the engine thread's part for the hub (``engine.server``): it takes the
pods' stream items (``engine.attach.stream_items``) and the hub's letters, and
answers with deliveries. Each item becomes one step, in arrival order:

- a ``Received`` batch → its ``kv_block_stored`` / ``kv_block_removed`` /
  ``kv_all_cleared`` events (``engine.attach.translate``);
- a ``Hole`` → a ``kv_gap``; a ``NewSegment`` → a ``kv_segment``;
- when no step was made for ``SCRAPE_STEP_S`` and a pod's scrape is new, a step
  without events carries it (an idle deployment's gauges still move).

Every step's metrics hold the batch's origin (pod, source seq, segment, replayed, how it
came: ``fill``, its dialect: ``wire``, source ts), each pod's cached / stored / removed block
counts and holes, each pod's latest scraped figures (``scraped``), and the fleet rows
(``fleet``, ``engine.attach.fleet.pod_row``: fidelity, churn, miss causes) of the step's pod
and, every ``FLEET_EVERY_S``, of every pod; what each routing policy would have done with the
requests seen (``policies``, ``engine.attach.policy_replay``) rides on every step that saw a
request and with every pod's rows. Steps are folded by the ledger (``engine.attach.ledger``:
the hash-only reducer ``HashCacheState`` plus removals and churn), recorded (run kind
``attached``) and published. The hub's ops
that would change an engine (submit, abort, reset, restart) are refused: the engine
is someone else's.

Shutdown (``Shutdown`` letter, sent once every subscription has ended): every item
still queued is made a step, then the run is finished. Nothing received is lost.

Writer of: the folded state, the run in the recorder, the health board.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.attach.fleet import pod_row
from engine.attach.ledger import FleetLedger
from engine.attach.locator import PodLocation, locate
from engine.attach.pod_source import PodSource
from engine.attach.policy_replay import PolicyReplay
from engine.attach.stream_items import Hole, NewSegment, Received, StreamItem
from engine.attach.translate import translate
from engine.events.folds.run_kind import RunKind
from engine.events.schema.step import StepRecord
from engine.events.schema.types import PROTOCOL_VERSION, Event, KVGap, KVSegment
from engine.protocol.errors import ErrorCode
from engine.protocol.messages import Error, Hello, Snapshot
from engine.protocol.ops import TakeSnapshot
from engine.server.worker.health import Health, HealthBoard, Status
from engine.server.worker.mailbox import Attach, Delivery, Detach, Letter, Mailbox, NewRun, Reply, Shutdown, StepOut
from engine.store.db import new_run_id

log = logging.getLogger("kvscope.attach")

Post = Callable[[list[Delivery]], None]
FLEET_EVERY_S = 1.0  # every pod's fleet row rides on a step this often (the step's own pod's always)
SCRAPE_STEP_S = 1.0  # an idle deployment's scraped figures become a step this often
MAX_ITEMS_PER_ITERATION = 512  # under a flood of batches, still answer letters between


class AttachWorker(threading.Thread):
    def __init__(self, pods: Sequence[PodSource], items: queue.Queue[StreamItem], post: Post,
                 mailbox: Mailbox, board: HealthBoard, config: dict[str, Any],
                 recorder: Any = None, label: str | None = None,
                 scrapers: dict[str, Any] | None = None, limits: dict[str, Any] | None = None,
                 wire_counters: Callable[[str], dict[str, Any]] | None = None) -> None:
        super().__init__(name="kvscope-attach-worker", daemon=True)
        self.pods = list(pods)
        self.items = items
        self.post = post
        self.mailbox = mailbox
        self.board = board
        self.config = dict(config)
        self.recorder = recorder
        self.label = label
        self.scrapers = dict(scrapers or {})
        self.limits = dict(limits or {})
        # the fold (``state``), what it forgets (removals, churn), and every routing policy's replay
        self.ledger = FleetLedger(replay=PolicyReplay([p.pod for p in self.pods]) if self.pods else None)
        self.state = self.ledger.state
        self.lock = threading.Lock()  # held while a step is folded, and while a locate reads
        self.locate_queries: dict[str, int] = {}  # per pod: locator answers given (read by /metrics)
        self.wire_counters = wire_counters or (lambda pod: {})  # a pod's PodSubscription.counters()
        self.fleet: dict[str, dict[str, Any]] = {}  # per pod, the latest row (engine.attach.fleet)
        self._fleet_all_at = 0.0  # when the last step carried every pod's row
        self._fleet_all_now = False  # the step being made carries every pod's row
        self.policy_summary: dict[str, Any] = {}  # the latest replay totals (read by /metrics)
        self.run_id: str | None = None
        self.num_steps = 0
        self.counts: dict[str, dict[str, int]] = {}  # per pod, swapped whole (read by /metrics)
        self._last_seq = -1
        self._last_metrics: dict[str, Any] = {}
        self._out: list[Delivery] = []
        self._want_snapshot: list[Letter] = []
        self._scrape_versions: dict[str, int] = {}
        self._last_step_at = time.monotonic()
        self.finished = threading.Event()

    # ---- lifecycle ---------------------------------------------------------------

    def run(self) -> None:
        self._install()
        try:
            self._serve()
        except BaseException:
            log.exception("kvscope attach: the worker thread crashed")
            self.board.set(Health(Status.ERROR, "the attach worker crashed; see the log"))
            self._finish_run()
            raise
        finally:
            self.finished.set()

    def _install(self) -> None:
        if self.recorder is not None:
            # model None: the stream does not say what the pods serve (the label is the label)
            self.run_id = self.recorder.start_run(self.config, model=None, label=self.label,
                                                  kind=RunKind.ATTACHED)
        else:
            self.run_id = new_run_id()
        self._out.append(NewRun(self._hello(), Snapshot(-1, self.state.to_snapshot(), {})))
        self.board.set(Health(Status.READY, self._detail(), self.run_id,
                              self.config.get("model_name"), self.config))
        self._flush()
        log.info("kvscope attach: run %s, %d pod(s): %s", self.run_id, len(self.pods),
                 ", ".join(f"{p.pod} ({p.endpoint})" for p in self.pods))

    def _detail(self) -> str:
        return f"attached to {len(self.pods)} pod(s): " + ", ".join(p.pod for p in self.pods)

    def _finish_run(self) -> None:
        if self.recorder is not None:
            self.recorder.finish(self.run_id)

    def _hello(self) -> Hello:
        return Hello(PROTOCOL_VERSION, self.run_id, self.config, self.limits)

    # ---- main loop ------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            for letter in self.mailbox.take(False, 256):
                if isinstance(letter.command, Shutdown):
                    self._shutdown()
                    return
                self._execute(letter)
            self._take_items(timeout=0.05)
            self._scrape_step()
            self._answer_snapshots()
            self._flush()

    def _take_items(self, timeout: float | None, limit: int = MAX_ITEMS_PER_ITERATION) -> int:
        n = 0
        try:
            item = self.items.get(timeout=timeout) if timeout else self.items.get_nowait()
            while True:
                self._on_item(item)
                n += 1
                if n >= limit:
                    break
                item = self.items.get_nowait()
        except queue.Empty:
            pass
        return n

    def _flush(self) -> None:
        if self._out:
            batch, self._out = self._out, []
            self.post(batch)

    # ---- items → steps ---------------------------------------------------------------

    def _on_item(self, item: StreamItem) -> None:
        step = self._last_seq + 1
        origin: dict[str, Any] = {"pod": item.pod, "segment": item.segment}
        if isinstance(item, Received):
            b = item.batch
            origin.update(source_seq=item.seq, replayed=item.replayed, source_ts=b.ts,
                          dp_rank=b.data_parallel_rank, fill=item.fill)
            if item.wire is not None:
                origin["wire"] = item.wire
            try:
                tr = translate(b, item.pod, step)
                events: list[Event] = tr.events
                if tr.unknown:
                    origin["unknown_events"] = list(tr.unknown)
            except ValueError as exc:  # decodable, but contradicts itself: a hole, marked
                events = [KVGap(step, item.pod, item.segment, item.seq, item.seq, f"undecodable: {exc}")]
        elif isinstance(item, Hole):
            origin.update(source_seq=item.first_seq)
            events = [KVGap(step, item.pod, item.segment, item.first_seq, item.last_seq, item.reason)]
            log.warning("kvscope attach: pod %s: batches %d..%d of segment %d are lost (%s)",
                        item.pod, item.first_seq, item.last_seq, item.segment, item.reason)
        elif isinstance(item, NewSegment):
            origin.update(source_seq=item.first_seq)
            events = [KVSegment(step, item.pod, item.segment, item.first_seq, item.reason)]
        else:
            raise TypeError(f"unknown stream item {item!r}")
        self._make_step(events, origin)

    def _scrape_step(self) -> None:
        if not self.scrapers or time.monotonic() - self._last_step_at < SCRAPE_STEP_S:
            return
        if any(s.version != self._scrape_versions.get(pod) for pod, s in self.scrapers.items()):
            self._make_step([], {"pod": None})

    def _make_step(self, events: list[Event], origin: dict[str, Any]) -> None:
        seq = self._last_seq + 1
        with self.lock:
            self.ledger.apply_events(events)
            self.state.step = seq
        metrics = dict(origin)
        metrics.update(self._pod_figures(origin.get("pod")))
        record = StepRecord(seq, seq, time.time(), events, metrics)
        if self.recorder is not None:
            self.recorder.record_step(record, self.run_id)
        self._last_seq, self._last_metrics = seq, metrics
        self._out.append(StepOut(self.run_id, record))
        self.num_steps += 1
        self._last_step_at = time.monotonic()

    def _fleet_rows(self, pod: str | None) -> dict[str, dict[str, Any]]:
        """The rows of ``pod`` (the step's) and, every ``FLEET_EVERY_S``, of every pod given."""
        now = time.monotonic()
        names = [p.pod for p in self.pods]
        self._fleet_all_now = pod is None or now - self._fleet_all_at >= FLEET_EVERY_S
        if self._fleet_all_now:
            self._fleet_all_at = now
            chosen = names + [n for n in self.state.pods if n not in names]
        else:
            chosen = [pod]
        rows = {n: pod_row(self.wire_counters(n), self.state.pods.get(n), self.ledger.pods.get(n))
                for n in chosen}
        merged = {**self.fleet, **rows}  # in the order the pods were given, then any other
        self.fleet = {**{n: merged[n] for n in names if n in merged}, **merged}
        return rows

    def _pod_figures(self, pod: str | None = None) -> dict[str, Any]:
        counts = {}
        for name, p in self.state.pods.items():
            counts[name] = {"cached_blocks": len(p.blocks), "stored_blocks": p.stored_blocks,
                            "removed_blocks": p.removed_blocks, "holes": len(p.holes),
                            "unknown_removals": p.unknown_removals, "segment": p.segment}
        self.counts = counts
        out: dict[str, Any] = {key: {name: c[key] for name, c in counts.items()}
                               for key in ("cached_blocks", "stored_blocks", "removed_blocks", "holes")}
        scraped = {}
        for pod, s in self.scrapers.items():
            scraped[pod] = s.latest()
            self._scrape_versions[pod] = s.version
        if scraped:
            out["scraped"] = scraped
        out["fleet"] = self._fleet_rows(pod)
        replay = self.ledger.replay
        if replay is not None and (self._fleet_all_now or replay.requests != self.policy_summary.get("requests")):
            out["policies"] = self.policy_summary = replay.summary(models=False)  # a request seen, or all pods' turn
        return out

    def policies(self) -> dict[str, Any]:
        """Each routing policy's replay (``engine.attach.policy_replay``): totals and the
        series over time, for ``GET /routers``. Any thread."""
        with self.lock:
            replay = self.ledger.replay
            if replay is None:
                return {"step": self._last_seq, "requests": 0, "policies": {}, "series": []}
            return {"step": self._last_seq, **replay.summary(), "series": replay.series()}

    def locate(self, token_ids: list[int]) -> tuple[int, list[PodLocation]]:
        """(step, each pod's answer) for a prompt: ``engine.attach.locator`` on the live fold.
        Any thread; LocateError for a prompt it cannot take."""
        names = [p.pod for p in self.pods]
        with self.lock:
            snap = self.state.to_snapshot()
            out = locate(snap, token_ids, self.ledger,
                         names + [p for p in snap.pods if p not in names])
            for loc in out:  # the miss explainer's probe sums, per pod
                self.ledger.pod(loc.pod).add_probe(loc.num_prompt_tokens, loc.hit_tokens, loc.misses())
        for loc in out:
            self.locate_queries[loc.pod] = self.locate_queries.get(loc.pod, 0) + 1
        return snap.step, out

    # ---- letters --------------------------------------------------------------------

    def _execute(self, letter: Letter) -> None:
        cmd = letter.command
        if isinstance(cmd, (Attach, TakeSnapshot)):
            self._want_snapshot.append(letter)
        elif isinstance(cmd, Detach):
            pass  # nothing of a viewer's lives here
        elif letter.sink is not None:
            self._out.append(Reply(letter.sink, Error(
                ErrorCode.READ_ONLY, f"{cmd.type} is not possible here: kvscope attach only "
                f"watches a deployment; send requests to its own API",
                getattr(cmd, "request_id", None), getattr(cmd, "type", None))))

    def _answer_snapshots(self) -> None:
        if not self._want_snapshot:
            return
        hello = self._hello()
        snap = Snapshot(self._last_seq, self.state.to_snapshot(), dict(self._last_metrics))
        for letter in self._want_snapshot:
            if letter.sink is None:
                continue
            if isinstance(letter.command, Attach):
                self._out.append(Reply(letter.sink, hello))
            self._out.append(Reply(letter.sink, snap))
        self._want_snapshot.clear()

    def _shutdown(self) -> None:
        self.board.set(Health(Status.STOPPING, "shutting down", self.run_id, self.config.get("model_name")))
        while self._take_items(timeout=None, limit=1 << 30):  # the subscriptions have ended
            pass
        if self.scrapers:  # the last reading, so the run ends with the deployment's figures
            self._make_step([], {"pod": None})
        self._finish_run()
        self._flush()
