"""``kvscope lesson``: list the lessons, or run one on the real engine and explain it.

    kvscope lesson --list [--json]
    kvscope lesson N [--model M] [--db PATH] [--json] [--no-record] [--device D] [--verbose]

Text mode prints the narrative, each question with the answer computed from the
run, the charts' numbers, the pool at the most telling step, the takeaway and the
recorded run ids, with the narrative's markdown rendered for a terminal
(``lessons.terminal``) and the engine's INFO log lines hidden unless ``--verbose``.
``--json`` prints one JSON document on stdout (the dashboard's
Lessons page reads it); everything else goes to stderr. The document is the
lesson's catalog entry (number, slug, title, short, sections, takeaway,
questions [{key, prompt, options, kind, answer: {value, option, explanation}}])
plus: model, model_name, charts (see lessons.base), facts, runs [{run_id, label,
variant, focus_step, num_steps, config}], pool {run_id, label, step, snapshot,
text}, recorded, elapsed_s. On failure it is {"error": message} and the exit code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from typing import Any

from engine import envs
from lessons.terminal import render, wants_ansi

MODEL_ENV = envs.LESSON_MODEL.name  # default --model (tests point it at a tiny model)
QUIET_LOGGERS = ("engine", "kvscope", "lessons")  # INFO from these is hidden unless --verbose


def _catalog() -> list[dict[str, Any]]:
    from lessons import LESSONS

    return [lesson.catalog() for lesson in LESSONS]


def format_list(catalog: list[dict[str, Any]]) -> str:
    lines = ["kvscope lessons (run one with: kvscope lesson N)"]
    for c in catalog:
        lines.append(f"  {c['number']}. {c['title']}  [{c['slug']}, {len(c['questions'])} questions]")
    return "\n".join(lines)


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt_value(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(_fmt_value(x) for x in v) + "]"
    return str(v)


def format_chart(chart: dict[str, Any]) -> str:
    """A chart spec as plain text: its numbers, one line per series or row."""
    out = [f"  {chart['title']}" + (f" ({chart['y_label']})" if chart.get("y_label") else "")]
    if chart["kind"] == "bars":
        for s in chart["series"]:
            cells = ", ".join(f"{c}: {_fmt_value(v)}" for c, v in zip(chart["categories"], s["values"]))
            out.append(f"    {s['name']}: {cells}")
    elif chart["kind"] == "lines":
        for s in chart["series"]:
            ys = [y for y in s["y"] if y is not None]
            shown = " ".join(_fmt_value(y) for y in ys[:40]) + (" ..." if len(ys) > 40 else "")
            out.append(f"    {s['name']} (per {chart.get('x_label') or 'x'}): {shown}")
    elif chart["kind"] == "table":
        out.append("    " + " | ".join(chart["columns"]))
        out += ["    " + " | ".join(_fmt_value(c) for c in row) for row in chart["rows"]]
    if chart.get("note"):
        out.append(f"    note: {chart['note']}")
    return "\n".join(out)


def format_lesson(doc: dict[str, Any], ansi: bool = False) -> str:
    """The lesson document as terminal text (markdown rendered by ``lessons.terminal``)."""
    def md(text: str) -> str:
        return render(text, ansi)

    title = f"Lesson {doc['number']}: {doc['title']}"
    out = [title, "=" * len(title), ""]
    out += [md(s) + "\n" for s in doc["sections"]]
    out.append(f"Scenario runs on {doc['model_name']} ({doc['elapsed_s']:.1f} s):")
    for r in doc["runs"]:
        c = r["config"]
        out.append(f"  {r['run_id'] or '(not recorded)'}  {r['label']}  [{c['num_blocks']} blocks x "
                   f"{c['block_size']}, max_model_len {c['max_model_len']}, "
                   f"{r['num_steps']} steps]")
    out += ["", "Predict, then look (answers computed from the run):"]
    for i, q in enumerate(doc["questions"], 1):
        a = q["answer"]
        out.append(f"Q{i}. {md(q['prompt'])}")
        for letter, opt in zip("abcdefgh", q["options"]):
            out.append(f"     {letter}) {opt}")
        shown = a["option"] if a["option"] is not None else _fmt_value(a["value"])
        out.append(f"     answer: {shown}")
        out.append(f"     why: {md(a['explanation'])}")
        out.append("")
    out.append("What the run shows:")
    out += [format_chart(c) for c in doc["charts"]]
    pool = doc["pool"]
    out += ["", f"The pool at step {pool['step']} of {pool['label']}:", pool["text"], "",
            f"Takeaway: {md(doc['takeaway'])}"]
    if pool["run_id"]:
        out.append(f"Look closer: kvscope replay {pool['run_id']} --step {pool['step']}"
                   " (or the dashboard's Replay page)")
    return "\n".join(out)


@contextlib.contextmanager
def _quiet_logs(verbose: bool):
    """INFO lines (model loading, pool sizes, runs recorded) would land in the middle of
    the lesson's text; keep warnings and errors, everything with --verbose."""
    if verbose:
        yield
        return
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, before):
            lg.setLevel(level)


def cmd_lesson(args: argparse.Namespace) -> int:
    if args.list or args.number is None:
        cat = _catalog()
        print(json.dumps(cat) if args.json else format_list(cat))
        return 0
    try:
        from lessons import get_lesson

        lesson = get_lesson(args.number)
        verbose = args.lesson_verbose or getattr(args, "verbose", False)
        if not args.json:
            print(f"Running lesson {lesson.number} on {args.model} (loads the model once)...",
                  file=sys.stderr, flush=True)
        # stdout carries only the JSON document; stray prints from libraries go to stderr
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout), \
                _quiet_logs(verbose):
            from lessons.runner import run_lesson

            doc = run_lesson(lesson, args.model, db=args.db, record=args.record,
                             device=args.device, num_threads=args.threads, width=args.width)
    except (ValueError, OSError) as exc:  # unknown lesson, bad model path, bad config (KVScopeError)
        if args.json:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        print(f"kvscope lesson: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, default=str) if args.json else format_lesson(doc, wants_ansi(sys.stdout)))
    return 0


def add_lesson_subcommands(subparsers: Any) -> None:
    """Register ``lesson`` on the kvscope CLI's subparsers."""
    p = subparsers.add_parser("lesson", help="guided lessons: predict, run the real engine, look")
    p.add_argument("number", type=int, nargs="?", help="the lesson to run (see --list)")
    p.add_argument("--list", action="store_true", help="list the lessons")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--model", default=envs.LESSON_MODEL.get() or "smollm2-135m",
                   help=f"smollm2-135m, a local HF dir or a .gguf file (default ${MODEL_ENV} "
                   "or smollm2-135m)")
    p.add_argument("--db", help="runs database (default $KVSCOPE_DB or data/runs.sqlite)")
    p.add_argument("--no-record", dest="record", action="store_false",
                   help="do not store the runs")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (lessons run tiny batches; 1 is usually fastest)")
    p.add_argument("--width", type=int, default=32, help="blocks per row of the pool grid")
    p.add_argument("--verbose", dest="lesson_verbose", action="store_true",
                   help="show the engine's INFO log lines (model loading, pool sizes, runs)")
    p.set_defaults(func=cmd_lesson)
