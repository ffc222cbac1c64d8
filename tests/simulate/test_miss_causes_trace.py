"""The miss-cause book on the shipped Mooncake-format trace: every admission's causes
equal the book's definition (``tests.core.test_miss_causes.SpecBook``)."""

from unittest import mock

from engine.core import CacheConfig, SchedulerConfig
from engine.simulate.cost import default_cost
from engine.simulate.pod import SimPod
from engine.simulate.report import summarize
from engine.simulate.simulation import SimConfig, simulate
from engine.simulate.trace import read_jsonl

from tests.core.test_miss_causes import checked_against_spec
from tests.simulate.test_traces import SHIPPED


def test_the_book_classifies_as_its_definition_on_the_shipped_trace():
    """One small pod (memory pressure: blocks evicted, hashes forgotten past a bound of
    2,000; 1,100 blocks hold one longest prompt)."""
    trace = read_jsonl(SHIPPED)
    sched = SchedulerConfig(max_model_len=17_000, max_num_batched_tokens=2048, max_num_seqs=32)
    cfg = SimConfig(1, "round-robin", sched, CacheConfig(block_size=16, num_blocks=1100), default_cost(),
                    miss_causes=True)
    calls = []

    def pod(*a, **k):
        p = SimPod(*a, **k)
        calls.append(checked_against_spec(p.scheduler, 2000))
        return p

    with mock.patch("engine.simulate.simulation.SimPod", pod):
        s = summarize(simulate(trace, cfg))
    assert calls[0][0] >= len(trace.requests)  # every admission checked, re-admissions too
    assert s["num_preemptions"] > 0 and s["num_blocks_evicted"] > 0
    assert all(s[f"prefix_cache_miss_{c}"] > 0 for c in ("cold", "evicted", "partial"))
