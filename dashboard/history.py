"""Metrics history: the per-step metrics dicts (engine.events.metrics.step_metrics) as tables.

Live and Replay both hand a list of metrics dicts, oldest first; the charts read
the DataFrame this builds. List-valued metrics (``ttft_s``, ``itl_s``, ``e2e_s``)
are observations per step and are gathered separately for the histograms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

_LISTS = ("ttft_s", "itl_s", "e2e_s")


def metrics_frame(history: Sequence[dict[str, Any]], window: int | None = None) -> pd.DataFrame:
    """One row per step (scalar metrics only); the last ``window`` steps if given."""
    rows = history[-window:] if window else history
    if not rows:
        return pd.DataFrame({"step": pd.Series(dtype="int64")})
    df = pd.DataFrame.from_records(
        [{k: v for k, v in m.items() if k not in _LISTS} for m in rows])
    # float columns keep None as NaN so lines break instead of plotting 0
    for col in df.columns:
        if df[col].dtype == object:
            conv = pd.to_numeric(df[col], errors="coerce")
            if conv.notna().any() or df[col].isna().all():
                df[col] = conv
    return df


def latency_samples(history: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Every TTFT / ITL / end-to-end observation of the run so far, in seconds."""
    out: dict[str, list[float]] = {k: [] for k in _LISTS}
    for m in history:
        for k in _LISTS:
            v = m.get(k)
            if v:
                out[k].extend(v)
    return out


def latest(history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The newest metrics dict, or an empty one before the first step."""
    return dict(history[-1]) if history else {}
