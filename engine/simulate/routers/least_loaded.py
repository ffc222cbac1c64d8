"""Least loaded: the pod with the fewest running + waiting requests, as scraped from
``vllm:num_requests_running`` / ``_waiting`` (Gateway API inference extension's queue
scorer, llm-d's load-aware scorer); ties to the first pod."""

from __future__ import annotations

from engine.simulate.routers.base import Router


class LeastLoaded(Router):
    name = "least-loaded"
    models = "least loaded: fewest running + waiting (GIE queue scorer, llm-d load-aware scorer)"

    def route(self, req, pods) -> int:
        return min(range(len(pods)), key=lambda i: (pods[i].load, i))
