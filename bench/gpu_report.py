"""Compose bench/gpu_check.sh's final table from DIR/summary.jsonl.

    python bench/gpu_report.py DIR [--results bench/RESULTS.md]

Prints the table (the check's last output), writes it to DIR/gpu_check_summary.md and
appends it, with the date and device, to the results file.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--results", default="bench/RESULTS.md")
    parser.add_argument("--device", default="unknown device")
    args = parser.parse_args()
    rows = []
    path = Path(args.dir) / "summary.jsonl"
    if path.exists():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [f"## GPU check {stamp} on {args.device}", "",
             "| check | result | target | status |", "|---|---|---|---|"]
    lines += [f"| {r['check']} | {r['result']} | {r.get('target', '')} | {r.get('status', '')} |" for r in rows]
    failed = [r for r in rows if r.get("status") == "FAIL"]
    verdict = (f"{len(failed)} of {len(rows)} checks FAILED" if failed
               else f"all {len(rows)} checks passed or informational")
    lines += ["", verdict]
    table = "\n".join(lines) + "\n"
    print(table)
    (Path(args.dir) / "gpu_check_summary.md").write_text(table)
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    fresh = not results.exists() or results.stat().st_size == 0
    with open(results, "a") as f:
        f.write(("# GPU results\n\n" if fresh else "\n") + table)


if __name__ == "__main__":
    main()
