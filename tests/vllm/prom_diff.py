"""Two ``/metrics`` texts side by side: a real ``vllm serve``'s and ``kvscope serve``'s.

A ``Scrape`` holds the ``vllm:*`` families of one scrape: per family its type, label names
and help, and every sample's value keyed by (sample name, labels). Label values that
legitimately differ between the two servers are normalised here and only here
(``NORMALISED``); the families one side leaves out are listed with the reason each
(``VLLM_ONLY``, ``ONLY_IN_KVSCOPE``), and ``cache_config_info``'s values that differ for a
reason are in ``CACHE_CONFIG_DIFFERENT``.

Counters and histograms are compared as deltas (``after - before``) over one workload, so
the session's servers can be shared with the tier's other tests.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

# Label values that name the server, not what it did: both servers are started with the
# same served model name and one engine, but a scrape is compared as if they were not.
NORMALISED = {"model_name": "<model>", "engine": "<engine>"}

# vLLM 0.32 families kvscope does not export, and why. Spec decode (vllm:spec_decode_*) and
# LoRA (vllm:lora_requests_info) are absent from both: vLLM exports them only with a
# speculative or LoRA config, and kvscope has neither.
VLLM_ONLY = {
    "vllm:engine_sleep_state": "sleep mode (--enable-sleep-mode, /sleep, /wake_up): kvscope's engine never sleeps",
    "vllm:estimated_flops_per_gpu": "vLLM's perf model's estimated FLOPs (MFU): kvscope estimates none",
    "vllm:estimated_read_bytes_per_gpu": "the same perf model's estimated memory reads",
    "vllm:estimated_write_bytes_per_gpu": "the same perf model's estimated memory writes",
    "vllm:external_prefix_cache_queries": "KV connector (offload, cross-instance) lookups: kvscope has no KV connector",
    "vllm:external_prefix_cache_hits": "KV connector (offload, cross-instance) hits: kvscope has no KV connector",
    "vllm:mm_cache_queries": "the multi-modal processor cache: kvscope serves text only",
    "vllm:mm_cache_hits": "the multi-modal processor cache: kvscope serves text only",
    "vllm:admission_rejections": "the API server's queue limits (--max-num-queued-reqs/-tokens): kvscope's "
                                 "bound is the scheduler's max_waiting, refused with an error reply",
}
# kvscope families a default vLLM 0.32 does not export, and why.
ONLY_IN_KVSCOPE = {
    "vllm:kv_block_lifetime_seconds": "block residency: kvscope records every block, always; vLLM samples "
                                      "blocks only with --kv-cache-metrics",
    "vllm:kv_block_idle_before_evict_seconds": "block residency, as above",
    "vllm:kv_block_reuse_gap_seconds": "block residency, as above",
}
# vllm:cache_config_info labels whose values differ for a reason (every other one is equal).
CACHE_CONFIG_DIFFERENT = {
    "num_gpu_blocks": "vLLM counts its null block: 64 usable blocks are 65 there",
    "kv_cache_size_tokens": "num_gpu_blocks x block_size, the null block included on vLLM's side",
    "kv_cache_max_concurrency": "from num_gpu_blocks, the null block included on vLLM's side",
    "num_gpu_blocks_override": "the fixtures size vLLM's pool by bytes or 65 blocks, kvscope's by its usable blocks",
    "kv_cache_memory_bytes": "vLLM's pool is sized by --kv-cache-memory-bytes, kvscope's by --num-kv-blocks",
    "gpu_memory_utilization": "the defaults differ (vLLM 0.92, kvscope 0.9); neither sizes a CPU pool by it",
    "hash_block_size": "vLLM's API process reports None (its engine core sets it); kvscope: the block size",
    "cache_hit_alignment_tokens": "vLLM's API process reports None (its engine core sets it); kvscope: the block size",
    "mamba_ssm_cache_dtype": "vLLM's CPU platform resets it to float32; kvscope keeps no SSM state (vLLM's default, auto)",
}
# Histograms of wall-clock times: their _count is compared, their _sum and buckets cannot be.
LATENCY_SUFFIX = "_seconds"


@dataclass(frozen=True, slots=True)
class Family:
    type: str
    label_names: frozenset[str]
    help: str


@dataclass
class Scrape:
    """The ``vllm:*`` families and samples of one /metrics text."""

    families: dict[str, Family] = field(default_factory=dict)
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> "Scrape":
        out = cls()
        for f in text_string_to_metric_families(text):
            # prometheus_client writes each family's _created timestamps as a gauge family of its own
            if not f.name.startswith("vllm:") or f.name.endswith("_created"):
                continue
            names: set[str] = set()
            for s in f.samples:
                names |= set(s.labels) - {"le"}
                if s.name.endswith("_created"):
                    continue
                labels = {k: NORMALISED.get(k, v) for k, v in s.labels.items()}
                if "le" in labels:  # "8.0" and "8" are one bucket bound
                    labels["le"] = str(float(labels["le"]))
                out.samples[(s.name, tuple(sorted(labels.items())))] = s.value
            out.families[f.name] = Family(f.type, frozenset(names), f.documentation)
        return out

    def get(self, name: str, **labels: str) -> float:
        """The one sample of ``name`` with these labels (normalised ones left out)."""
        found = [v for (n, ls), v in self.samples.items()
                 if n == name and all(dict(ls).get(k) == str(x) for k, x in labels.items())]
        assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
        return found[0]

    def bounds(self, family: str) -> list[float]:
        """A histogram's bucket bounds (+Inf included), ascending."""
        return sorted({float(dict(ls)["le"]) for n, ls in self.samples if n == family + "_bucket"})

    def labels_of(self, name: str) -> dict[str, str]:
        """The labels of ``name``'s one sample (an info gauge's), normalised ones left out."""
        (labels,) = [dict(ls) for n, ls in self.samples if n == name]
        return {k: v for k, v in labels.items() if k not in NORMALISED}


def scrape(server) -> Scrape:
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=30) as r:
        return Scrape.parse(r.read().decode())


def compared_families(s: Scrape, only: dict[str, str]) -> dict[str, Family]:
    """``s``'s families less those its side alone exports."""
    return {n: f for n, f in s.families.items() if n not in only}


def deltas(before: Scrape, after: Scrape) -> dict[tuple, float]:
    """Every counter and histogram sample's growth over the workload (gauges: their value after)."""
    out = {}
    for key, v in after.samples.items():
        family = after.families.get(_family_of(key[0], after))
        if family is not None and family.type in ("counter", "histogram"):
            v -= before.samples.get(key, 0.0)
        out[key] = v
    return out


def _family_of(sample_name: str, s: Scrape) -> str:
    for suffix in ("_total", "_count", "_sum", "_bucket", ""):
        if suffix and sample_name.endswith(suffix) and sample_name[: -len(suffix)] in s.families:
            return sample_name[: -len(suffix)]
    return sample_name


def comparable(d: dict[tuple, float], s: Scrape) -> dict[tuple, float]:
    """The samples whose values must be equal on both servers: every counter, every
    histogram's _count, and the _sum and buckets of the token histograms; the gauges after
    the workload (an idle server's); not cache_config_info (its labels are compared apart),
    not the families only one side exports."""
    out = {}
    for (name, labels), v in d.items():
        family = _family_of(name, s)
        if family in VLLM_ONLY or family in ONLY_IN_KVSCOPE or family == "vllm:cache_config_info":
            continue
        if family.endswith(LATENCY_SUFFIX) and not name.endswith("_count"):
            continue
        out[(name, labels)] = v
    return out


def differences(vllm: dict[tuple, float], kvscope: dict[tuple, float]) -> list[str]:
    """Lines naming every sample whose values differ (or that one side lacks)."""
    lines = []
    for key in sorted(set(vllm) | set(kvscope)):
        a, b = vllm.get(key), kvscope.get(key)
        if a != b:
            name, labels = key
            shown = ",".join(f"{k}={v}" for k, v in labels if k not in NORMALISED)
            lines.append(f"{name}{{{shown}}}: vLLM {a} kvscope {b}")
    return lines
