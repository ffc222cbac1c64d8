"""Key figures of a whole stored run, for the Compare page (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# The engine settings a stored run is described by (Replay) and compared on (Compare).
CONFIG_KEYS = ("model", "block_size", "num_blocks", "max_model_len", "max_num_batched_tokens",
               "max_num_seqs", "enable_prefix_caching", "enable_chunked_prefill")


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summarize_run(history: Sequence[dict[str, Any]], num_requests: int) -> dict[str, Any]:
    """Run-level numbers from the per-step metrics (units in the keys)."""
    if not history:
        return {}
    last = history[-1]
    busy = [m for m in history if m.get("num_requests_running")]
    t0, t1 = history[0].get("ts"), last.get("ts")
    elapsed = (t1 - t0) if t0 is not None and t1 is not None else None
    out_tokens = last.get("num_output_tokens") or 0
    return {
        "steps": len(history),
        "requests": num_requests,
        "output tokens": out_tokens,
        "wall time (s)": elapsed,
        "output tokens / s": out_tokens / elapsed if elapsed else None,
        "mean running requests": _mean([m.get("num_requests_running") for m in history]),
        "max running requests": max((m.get("num_requests_running") or 0 for m in history),
                                    default=0),
        "mean kv_cache_usage (%)": _pct(_mean([m.get("kv_cache_usage") for m in busy])),
        "mean kv_token_usage (%)": _pct(_mean([m.get("kv_token_usage") for m in busy])),
        "mean internal fragmentation (%)": _pct(_mean([m.get("internal_fragmentation")
                                                       for m in busy])),
        "mean token budget used (%)": _pct(_mean([m.get("budget_used") for m in busy])),
        "prefix cache hit rate (%)": _pct(last.get("prefix_cache_hit_rate")),
        "evictions": last.get("num_evictions", 0),
        "copy-on-write copies": last.get("cow_copies", 0),
        "preemptions": last.get("num_preemptions", 0),
        "TTFT p50 (ms)": _ms(last.get("ttft_p50_s")),
        "TTFT p90 (ms)": _ms(last.get("ttft_p90_s")),
        "ITL p50 (ms)": _ms(last.get("itl_p50_s")),
        "ITL p90 (ms)": _ms(last.get("itl_p90_s")),
    }


def _pct(v: float | None) -> float | None:
    return None if v is None else round(100 * v, 1)


def _ms(v: float | None) -> float | None:
    return None if v is None else round(1000 * v, 1)


def compare_rows(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows 'figure | run A | run B | B − A' for every figure either run has."""
    rows = []
    for k in dict.fromkeys([*a, *b]):
        va, vb = a.get(k), b.get(k)
        diff = None
        if isinstance(va, (int, float)) and isinstance(vb, (int, float)) \
                and not isinstance(va, bool):
            diff = round(vb - va, 3)
        rows.append({"figure": k, "run A": _fmt(va), "run B": _fmt(vb),
                     "B − A": _fmt(diff)})
    return rows


def config_rows(ca: dict[str, Any], cb: dict[str, Any]) -> list[dict[str, Any]]:
    """Engine settings of both runs; ``differs`` flags what the comparison is about."""
    return [{"setting": k, "run A": _fmt(ca.get(k)), "run B": _fmt(cb.get(k)),
             "differs": "yes" if ca.get(k) != cb.get(k) else ""} for k in CONFIG_KEYS]


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:.0f}"
    return str(v)
