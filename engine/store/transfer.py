"""Export a run to JSON lines and import it back (under a new run id).

Format (one JSON object per line, ``kind`` first):
- ``{"kind": "run", "format": "kvscope-run", "version": 1, "id", "started_at",
  "finished_at", "config": {...}, "model", "label", "run_kind"}`` — exactly one, first
  (``run_kind``: ``engine`` | ``attached``; absent in older exports: ``engine``);
- ``{"kind": "step", "seq", "step", "ts", "events": [...], "metrics": {...}}`` in seq order;
- ``{"kind": "request", "request_id", "prompt", "params", "outputs", "timings"}``;
- ``{"kind": "loss", "first_seq", "last_seq", "first_step", "last_step", "num_steps",
  "num_requests", "reason", "ts"}`` where the recorder dropped rows (see ``Loss``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from engine.events.folds.run_kind import RunKind
from engine.events.schema.step import StepRecord
from engine.store import db as dbm
from engine.store import loss as lossm
from engine.store.loss import Loss
from engine.store.runs import RunStore

FORMAT, VERSION = "kvscope-run", 1


def iter_export(store: RunStore, run_id: str) -> Iterable[dict[str, Any]]:
    """The run as export objects (see module docstring)."""
    run = dict(store.get_run(run_id))
    run_kind = run.pop("kind")  # "kind" names the line; the run's own kind travels apart
    yield {"kind": "run", "format": FORMAT, "version": VERSION, **run, "run_kind": run_kind}
    for rec in store.load_steps(run_id):
        yield {"kind": "step", **rec.to_dict()}
    for req in store.load_requests(run_id):
        req = dict(req)
        req.pop("run_id", None)
        yield {"kind": "request", **req}
    for loss in store.losses(run_id):
        row = loss.to_row()
        for key in ("id", "run_id"):
            row.pop(key)
        yield {"kind": "loss", **row}


def export_run(store: RunStore, run_id: str, dest: str | Path | IO[str]) -> int:
    """Write the run as JSON lines to a path or text file; returns the line count."""
    lines = 0
    with _open(dest, "w") as fp:
        for obj in iter_export(store, run_id):
            fp.write(json.dumps(obj, separators=(",", ":")) + "\n")
            lines += 1
    return lines


def import_run(store: RunStore, src: str | Path | IO[str], label: str | None = None) -> str:
    """Read an exported run into ``store`` under a fresh id (one transaction); returns it.

    ``label`` overrides the exported label. Raises ValueError on a malformed file."""
    with _open(src, "r") as fp:
        objs = [json.loads(line) for line in fp if line.strip()]
    if not objs or objs[0].get("kind") != "run" or objs[0].get("format") != FORMAT:
        raise ValueError("not a kvscope run export (the first line must be the run header)")
    head = objs[0]
    if head.get("version") != VERSION:
        raise ValueError(f"unsupported export version {head.get('version')!r}")
    new_id = dbm.new_run_id()
    steps, requests, losses = [], [], []
    for obj in objs[1:]:
        kind = obj.pop("kind", None)
        if kind == "step":
            d = StepRecord.from_dict(obj).to_dict()  # validates events on the way in
            steps.append(dbm.step_row(new_id, d))
        elif kind == "loss":
            losses.append(Loss.from_row({**obj, "run_id": new_id, "id": None}).to_row())
        elif kind == "request":
            requests.append({"run_id": new_id, "request_id": obj["request_id"],
                             "prompt": obj.get("prompt"), "params": dbm.dumps(obj.get("params")),
                             "outputs": dbm.dumps(obj.get("outputs")),
                             "timings": dbm.dumps(obj.get("timings")),
                             "source": obj.get("source")})
        else:
            raise ValueError(f"unknown line kind {kind!r} in run export")
    run = {"id": new_id, "started_at": head.get("started_at"),
           "finished_at": head.get("finished_at"), "config": dbm.dumps(head.get("config") or {}),
           "model": head.get("model"), "label": label if label is not None else head.get("label"),
           "kind": RunKind.of(head.get("run_kind")).value}
    with store.db() as d, d.atomic():
        d["runs"].insert(run)
        if steps:
            d["steps"].insert_all(steps)
        if requests:
            d["requests"].insert_all(requests)
        if losses:
            lossm.ensure_table(d)
            d[lossm.TABLE].insert_all(losses)
    return new_id


class _open:
    """Context manager over a path (opened and closed here) or an open text file."""

    def __init__(self, target: str | Path | IO[str], mode: str) -> None:
        self.target, self.mode, self.fp = target, mode, None

    def __enter__(self) -> IO[str]:
        if isinstance(self.target, (str, Path)):
            self.fp = open(self.target, self.mode, encoding="utf-8")
            return self.fp
        return self.target

    def __exit__(self, *exc: object) -> None:
        if self.fp is not None:
            self.fp.close()
