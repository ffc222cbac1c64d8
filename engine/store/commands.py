"""``kvscope runs`` and ``kvscope replay`` (the CLI wires them via add_store_subcommands).

Each command takes an argparse Namespace, prints text and returns an exit code
(0 ok, 1 user error such as an unknown run or a step out of range).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from typing import Any

from engine.events.folds.hash_cache_snapshot import HashCacheSnapshot
from engine.events.render import render_snapshot
from engine.store.runs import RunStore, StepOutOfRangeError, UnknownRunError
from engine.store.transfer import export_run, import_run

_METRICS_SHOWN = ("kv_cache_usage", "kv_token_usage", "internal_fragmentation",
                  "prefix_cache_hit_rate", "num_preemptions", "num_evictions", "cow_copies")


def _fmt_time(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def fmt_figure(v: Any, unit: str = "") -> str:
    """A figure as the CLI prints it (``kvscope replay``, ``kvscope submit``): ``-`` when absent."""
    return "-" if v is None else (f"{v:.3f}{unit}" if isinstance(v, float) else f"{v}{unit}")


def format_runs(runs: list[dict[str, Any]]) -> str:
    """The runs table printed by ``kvscope runs``."""
    if not runs:
        return "no runs recorded yet"
    lossy = any(r.get("lost_steps") or r.get("lost_requests") for r in runs)
    header = ("run id", "started", "steps", "reqs", "pool", "model", "label") + (("lost",) if lossy else ())
    rows = [header]
    for r in runs:
        cfg = r["config"] or {}
        model = r["model"]
        if r.get("kind") == "attached":
            pool = f"attached, {len(cfg.get('pods') or [])} pod(s)"
            if model == cfg.get("model_name"):  # recorded before attach stopped writing its label there
                model = None
        else:
            pool = f"{cfg.get('num_blocks', '?')}x{cfg.get('block_size', '?')}"
        lost = (f"{r.get('lost_steps') or 0} steps, {r.get('lost_requests') or 0} reqs"
                if r.get("lost_steps") or r.get("lost_requests") else "")
        rows.append((r["id"], _fmt_time(r["started_at"]), str(r["num_steps"]),
                     str(r["num_requests"]), pool, model or "-", r["label"] or "")
                    + ((lost,) if lossy else ()))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def cmd_runs(args: argparse.Namespace) -> int:
    """List runs; or with --label RUN TEXT / --delete RUN / --export RUN PATH /
    --import PATH act on one."""
    store = RunStore(getattr(args, "db", None))
    try:
        if getattr(args, "label", None):
            run_id, text = args.label
            store.label_run(run_id, text or None)
            print(f"labelled {run_id}: {text!r}")
        elif getattr(args, "delete", None):
            store.delete_run(args.delete)
            print(f"deleted {args.delete}")
        elif getattr(args, "export", None):
            run_id, path = args.export
            n = export_run(store, run_id, path)
            print(f"exported {run_id} to {path} ({n} lines)")
        elif getattr(args, "import_path", None):
            new_id = import_run(store, args.import_path)
            print(f"imported {args.import_path} as {new_id}")
        else:
            print(format_runs(store.list_runs()))
    except (UnknownRunError, ValueError, OSError, sqlite3.Error) as exc:
        print(f"kvscope runs: error: {exc}", file=sys.stderr)
        return 1
    return 0


def replay_json(store: RunStore, run_id: str, step: int | None) -> dict[str, Any]:
    """The state at ``step`` as one JSON object, for every kind of run:
    ``{"run_id", "kind", "step", "first_step", "last_step", "metrics", "losses", ...}`` plus
    ``"snapshot"`` (the ``PoolSnapshot``'s JSON) for an engine run, or ``"pods"``:
    ``{pod: {"segment", "incomplete", "holes", "cached_blocks": [{"hash", "parent",
    "num_tokens"}]}}`` (blocks in store order) for an attached run."""
    run = store.get_run(run_id)
    snap = store.snapshot_at(run_id, step)
    lo, hi = store.step_range(run_id)
    out: dict[str, Any] = {"run_id": run["id"], "kind": run["kind"], "label": run.get("label"),
                           "step": snap.step, "first_step": lo, "last_step": hi,
                           "metrics": store.metrics_at(run_id, snap.step) or {},
                           "losses": [x.describe() for x in store.losses(run_id)]}
    if isinstance(snap, HashCacheSnapshot):
        out["pods"] = {name: {"segment": p.segment, "incomplete": p.incomplete,
                              "holes": [h.describe() for h in p.holes],
                              "cached_blocks": [{"hash": b.hash, "parent": b.parent,
                                                 "num_tokens": b.num_tokens} for b in p.blocks]}
                       for name, p in snap.pods.items()}
    else:
        out["snapshot"] = snap.to_dict()
    return out


def render_hash_cache(snap: HashCacheSnapshot, limit: int = 12) -> str:
    """Per pod: cached blocks, holes, and the most recently stored blocks."""
    lines = []
    for name, p in snap.pods.items():
        flag = " (INCOMPLETE: a hole in this segment)" if p.incomplete else ""
        lines.append(f"pod {name}: {p.num_blocks} cached blocks of {p.block_size or '?'} tokens, "
                     f"segment {p.segment}, {p.stored_blocks} stored / {p.removed_blocks} removed "
                     f"so far{flag}")
        for h in p.holes:
            lines.append(f"  hole at step {h.step}: {h.describe()}")
        for b in p.blocks[-limit:]:
            lines.append(f"  {b.hash[:16]}  parent {(b.parent or '-')[:16]:16}  {b.num_tokens} tokens"
                         f"  {b.medium or ''}")
        if p.num_blocks > limit:
            lines.append(f"  ... and {p.num_blocks - limit} more (--json lists them all)")
    return "\n".join(lines) or "no pod has sent anything yet"


def cmd_replay(args: argparse.Namespace) -> int:
    """Print the state at step N of a run (default: its last step): for an engine run the
    pool as a block grid plus every request's block table, for an attached run each
    pod's cached blocks, rebuilt from the recorded events; and a note per loss marker
    (past the first lost step the state cannot be rebuilt: an error). With ``--json``,
    the state as JSON (``replay_json``)."""
    store = RunStore(getattr(args, "db", None))
    step = getattr(args, "step", None)
    try:
        if getattr(args, "json", False):
            print(json.dumps(replay_json(store, args.run_id, step), indent=1))
            return 0
        run = store.get_run(args.run_id)
        snap = store.snapshot_at(args.run_id, step)
        lo, hi = store.step_range(args.run_id)
        metrics = store.metrics_at(args.run_id, snap.step) or {}
        losses = store.losses(args.run_id)
    except (UnknownRunError, StepOutOfRangeError, ValueError, sqlite3.Error) as exc:
        print(f"kvscope replay: error: {exc}", file=sys.stderr)
        return 1
    title = f"run {run['id']}" + (f" ({run['label']})" if run.get("label") else "")
    kind = " | attached" if isinstance(snap, HashCacheSnapshot) else ""
    print(f"{title}{kind} | model {run.get('model') or '-'} | step {snap.step} of {lo}..{hi}")
    if isinstance(snap, HashCacheSnapshot):
        print("a hash-only stream: no block ids, ref counts or block tables")
        print(render_hash_cache(snap))
    else:
        print(render_snapshot(snap, width=getattr(args, "width", None) or 32))
    shown = [f"{k} {fmt_figure(metrics[k])}" for k in _METRICS_SHOWN if k in metrics]
    if shown:
        print("\nmetrics: " + " | ".join(shown))
    for loss in losses:  # the state shown is before the first of these (state_at refuses past it)
        print(f"\nnote: {loss.describe()}")
    return 0


def add_store_subcommands(subparsers: Any) -> None:
    """Register ``runs`` and ``replay`` on an argparse subparsers object; each sets
    ``func`` to its command, so the CLI calls ``args.func(args)``."""
    p = subparsers.add_parser("runs", help="list, label, delete, export or import recorded runs")
    p.add_argument("--db", help="runs database (default $KVSCOPE_DB or data/runs.sqlite)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--label", nargs=2, metavar=("RUN_ID", "TEXT"), help="set a run's label")
    g.add_argument("--delete", metavar="RUN_ID", help="delete a run and its steps")
    g.add_argument("--export", nargs=2, metavar=("RUN_ID", "PATH"), help="export as JSON lines")
    g.add_argument("--import", dest="import_path", metavar="PATH",
                   help="import an exported run (gets a new id)")
    p.set_defaults(func=cmd_runs)

    p = subparsers.add_parser("replay", help="show the KV pool (or an attached run's cache) at a step")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--step", type=int, default=None, help="engine step (default: the last)")
    p.add_argument("--width", type=int, default=32, help="blocks per grid row")
    p.add_argument("--json", action="store_true",
                   help="print the state as JSON: the snapshot, or per pod the cached blocks")
    p.add_argument("--db", help="runs database (default $KVSCOPE_DB or data/runs.sqlite)")
    p.set_defaults(func=cmd_replay)
