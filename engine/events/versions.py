"""Which vLLM (or paper) each modelled behaviour follows: one wording for lessons, docs and pages.

kvscope mixes behaviours from different generations of vLLM. A learner must be able to
tell which one a lesson or a dashboard page shows, so every text that describes vLLM
behaviour labels it with one of the ``Behaviour`` constants here (``label`` for a short
tag, ``tag()`` for "[label]", ``where`` for the vLLM files it was checked against).

Checked against vLLM's source (paths are in vllm-project/vllm):

- v0's copy-on-write: ``vllm/core/block/common.py`` (``CopyOnWriteTracker``: a block is
  appendable only with ref count <= 1, else a ``(src, dst)`` copy is recorded) and
  ``vllm/core/block/prefix_caching_block.py`` (``fork`` shares every block of the
  sequence, the partial last one included). The v0 engine was removed from vLLM later.
- v1's parallel sampling: ``vllm/v1/engine/parallel_sampling.py`` (``ParentRequest``):
  a request with ``n > 1`` is fanned out into ``n`` child requests with ``n = 1`` (ids
  ``f"{index}_{parent}"``, seed ``seed + index`` when a seed is given); the children
  share full prompt blocks only through prefix-cache hits; there is no copy-on-write and
  each child computes and owns its partial last block. The output processor aggregates
  the children into one output.
- The free-queue rule "blocks without a hash are reused before cached ones": v0's
  ``PrefixCachingBlockAllocator._allocate_block_id`` takes a hashless block first and
  evicts a cached one only when none is left; v1's ``BlockPool.free_blocks``
  (``vllm/v1/core/block_pool.py``) long appended every freed block at the tail of
  ``FreeKVCacheBlockQueue`` (``vllm/v1/core/kv_cache_utils.py``) and, since vLLM PR
  #43447 (2026), prepends hashless ("fresh") blocks and appends cached ones.
- Schedule-time hashing, tail-first freeing, the hit cap at ``num_tokens - 1``,
  recompute preemption of the last running request: ``vllm/v1/core/kv_cache_manager.py``
  (``allocate_slots`` caches the blocks the step fills), ``vllm/v1/core/
  single_type_kv_cache_manager.py`` (``free`` releases ``reversed(blocks)``),
  ``vllm/v1/core/sched/scheduler.py`` (``preempted_req = self.running.pop()``).

Pure Python, no imports from the rest of kvscope, so the dashboard can use it.
"""

from __future__ import annotations

from dataclasses import dataclass

V1 = "vLLM v1 (0.x)"
V0 = "vLLM v0"
PAPER_V0 = "paper / vLLM v0"
V0_AND_V1 = "vLLM v0 and v1"
PAPER = "PagedAttention paper"
KVSCOPE = "kvscope only"


@dataclass(frozen=True, slots=True)
class Behaviour:
    """One behaviour kvscope models: ``label`` says whose it is, ``what`` says it in a
    sentence, ``where`` names the vLLM source it was checked against."""

    key: str
    label: str
    what: str
    where: str = ""

    def tag(self) -> str:
        """``[label]``, for the end of a sentence that describes the behaviour."""
        return f"[{self.label}]"


PAGING = Behaviour(
    "paging", f"{PAPER}, all vLLM",
    "KV memory in fixed-size blocks found through per-request block tables.")
CONTIGUOUS_BASELINE = Behaviour(
    "contiguous_baseline", "the paper's baseline: servers before PagedAttention",
    "one contiguous KV region per request, reserved up front.")
COPY_ON_WRITE = Behaviour(
    "copy_on_write", PAPER_V0,
    "n > 1 forks share every block, the partial last one too; a write into a shared block "
    "copies it first (n_sharing='cow').",
    "vllm/core/block/common.py CopyOnWriteTracker; vllm/core/block/prefix_caching_block.py fork")
PREFIX_CACHE_SAMPLES = Behaviour(
    "prefix_cache_samples", V1,
    "n > 1 runs as n child requests that share full prompt blocks through prefix-cache "
    "hits; no copy-on-write, each child owns its partial last block (n_sharing='prefix_cache').",
    "vllm/v1/engine/parallel_sampling.py ParentRequest")
FULL_BLOCK_HASHING = Behaviour(
    "full_block_hashing", V0_AND_V1,
    "the prefix cache hashes only full blocks, each hash chained to its parent's, so a hit "
    "is a run of whole blocks from the start of the prompt.",
    "vllm/v1/core/kv_cache_utils.py hash_block_tokens; vllm/core/block/prefix_caching_block.py")
SCHEDULE_TIME_HASHING = Behaviour(
    "schedule_time_hashing", V1,
    "a full block is hashed when the step that fills it is scheduled, so a request admitted "
    "later in the same step already hits it.",
    "vllm/v1/core/kv_cache_manager.py allocate_slots")
HIT_CAP = Behaviour(
    "hit_cap", V1,
    "a prefix hit covers whole blocks and never the last prompt token (its logits are needed).",
    "vllm/v1/core/kv_cache_manager.py get_computed_blocks")
TAIL_FIRST_FREE = Behaviour(
    "tail_first_free", V1,
    "a finished request's blocks are freed last block first, so its tail is evicted before "
    "its head.",
    "vllm/v1/core/single_type_kv_cache_manager.py free")
LRU_EVICTION = Behaviour(
    "lru_eviction", V0_AND_V1,
    "a freed cached block keeps its hash and stays hittable; the least recently freed one "
    "is reused (evicted) first.",
    "vllm/v1/core/block_pool.py get_new_blocks; vllm/core/evictor.py")
HASHLESS_FIRST = Behaviour(
    "hashless_first", "vLLM v0, and v1 since PR #43447 (2026)",
    "blocks without a hash are reused before cached ones (earlier v1 releases appended "
    "every freed block at the tail, hashed or not).",
    "vllm/core/block/prefix_caching_block.py _allocate_block_id; "
    "vllm/v1/core/block_pool.py free_blocks (prepend_n / append_n)")
UNIFIED_SCHEDULE = Behaviour(
    "unified_schedule", V1,
    "no prefill phase: each request closes the gap between computed and known tokens, "
    "within one token budget per step, running requests first.",
    "vllm/v1/core/sched/scheduler.py schedule")
LONG_PREFILL_CAP = Behaviour(
    "long_prefill_cap", V1,
    "long_prefill_token_threshold caps one request's tokens per step.",
    "vllm/v1/core/sched/scheduler.py schedule")
PREEMPT_NEWEST = Behaviour(
    "preempt_newest", V1,
    "when blocks run out the last running request (FCFS: the newest) is preempted by "
    "recompute (v0 could also swap to CPU).",
    "vllm/v1/core/sched/scheduler.py schedule (self.running.pop())")
KV_BUDGET = Behaviour(
    "kv_budget", V1,
    "the KV budget is fixed at start-up (gpu_memory_utilization minus a profiled forward) "
    "and reported as the maximum concurrency of max_model_len sequences.",
    "vllm/v1/core/kv_cache_utils.py get_kv_cache_config")
FAIR_SHARES = Behaviour(
    "fair_shares", KVSCOPE,
    "kvscope serve's default scheduling_policy='fair': with several clients at work each "
    "gets an equal part of a step's tokens and sequences (with serve's fair_ratio=2, at most "
    "twice what the lightest client at work could use), and preemption takes the newest "
    "request of the client holding the most; with one client it is FCFS. vLLM schedules "
    "fcfs or by request priority.")
MISS_CAUSE_SPLIT = Behaviour(
    "miss_causes", KVSCOPE,
    "prefix-cache misses split by cause (cold, evicted, partial, disabled); vLLM counts "
    "only queries and hits.")
BLOCK_USAGE = Behaviour(
    "block_usage", V1,
    "vllm:kv_cache_usage_perc counts referenced blocks, whatever they hold: a block with one "
    "token counts as a full one, and a freed block that keeps its hash counts as free.",
    "vllm/v1/core/block_pool.py get_usage; vllm/v1/metrics/loggers.py kv_cache_usage_perc")

PREFIX_ROUTING = Behaviour(
    "prefix_routing", "llm-d inference scheduler",
    "a router scores each pod by the longest run of the request's block hashes, from the "
    "first, that the pod's KV events say it holds; the highest score wins, ties go to the "
    "least loaded pod (llm-d's precise prefix-cache scorer; engine/simulate/routers).",
    "llm-d-kv-cache's indexer behind llm-d-inference-scheduler's precise-prefix-cache-scorer")

BEHAVIOURS: tuple[Behaviour, ...] = (
    PAGING, CONTIGUOUS_BASELINE, COPY_ON_WRITE, PREFIX_CACHE_SAMPLES, FULL_BLOCK_HASHING,
    SCHEDULE_TIME_HASHING, HIT_CAP, TAIL_FIRST_FREE, LRU_EVICTION, HASHLESS_FIRST,
    UNIFIED_SCHEDULE, LONG_PREFILL_CAP, PREEMPT_NEWEST, FAIR_SHARES, KV_BUDGET, MISS_CAUSE_SPLIT,
    BLOCK_USAGE, PREFIX_ROUTING,
)