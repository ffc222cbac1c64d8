"""The contiguous-KV baseline: transformers' ``generate`` with static batching.

Requests are cut into fixed batches of ``batch_size`` in arrival order. Each batch is
left-padded to its longest prompt and decoded, greedy, until its longest output is
done (``max_new_tokens`` = the batch's largest ``max_tokens``; EOS does not stop it,
matching kvscope's ``ignore_eos``); shorter requests are truncated to their own
length afterwards. A batch starts only when the previous one has returned.

Timing: a logits processor stamps the time of every decoding step, so token k of
every row in the batch is produced at stamp k (stamp 0 ends the prefill: the TTFT of
every request in the batch). A request's result is handed back when ``generate``
returns (static batching has no early exit).

KV memory: the DynamicCache holds [B, kv_heads, P_max + N_max - 1, head_dim] per layer
for K and for V at the end of a batch; reserved = that size, used = the slots of real
tokens (each row's own prompt + its own output - 1). Peak = the largest batch.
"""

from __future__ import annotations

import copy
import time

import torch

from bench.measure import RssSampler, RunRecord, loadavg
from bench.workloads import Workload


def load_hf(weights_dir):
    """transformers' own model from the same HF directory the engine loaded."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(weights_dir), dtype=torch.float32).eval()


def _timing_processor():
    from transformers import LogitsProcessor

    class StepStamps(LogitsProcessor):
        """Records when each decoding step's logits are ready; changes nothing."""

        def __init__(self) -> None:
            self.stamps: list[float] = []
            self.on_step = None

        def __call__(self, input_ids, scores):
            self.stamps.append(time.perf_counter())
            if self.on_step is not None:
                self.on_step()
            return scores

    return StepStamps()


def _kv_bytes_per_token(model) -> int:
    cfg = model.config
    heads = cfg.num_attention_heads
    kvh = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return 2 * cfg.num_hidden_layers * kvh * hd * 4  # K and V, float32


def run_hf(model, workload: Workload, batch_size: int, pad_id: int,
           system: str = "hf_static", progress=None) -> RunRecord:
    """Static batches of ``batch_size`` in arrival order through ``model.generate``."""
    from transformers import LogitsProcessorList

    reqs = workload.requests
    n = len(reqs)
    token_times: list[list[float]] = [[] for _ in range(n)]
    done = [0.0] * n
    ids: list[list[int]] = [[] for _ in range(n)]
    per_token = _kv_bytes_per_token(model)
    reserved_peak = used_peak = 0
    gen_cfg = copy.deepcopy(model.generation_config)
    gen_cfg.eos_token_id = []  # like ignore_eos: run every row to max_new_tokens (None would
    # fall back to the model's own EOS)
    gen_cfg.do_sample = False
    gen_cfg.pad_token_id = pad_id
    for k in ("temperature", "top_p", "top_k"):
        if hasattr(gen_cfg, k):
            setattr(gen_cfg, k, None)
    load0 = loadavg()
    with RssSampler() as rss, torch.inference_mode():
        t0, c0 = time.perf_counter(), time.process_time()
        for b0 in range(0, n, batch_size):
            batch = list(range(b0, min(n, b0 + batch_size)))
            p_max = max(len(reqs[i].prompt_ids) for i in batch)
            n_max = max(reqs[i].max_tokens for i in batch)
            input_ids = torch.full((len(batch), p_max), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), p_max), dtype=torch.long)
            for row, i in enumerate(batch):
                p = reqs[i].prompt_ids
                input_ids[row, p_max - len(p):] = torch.tensor(p)
                mask[row, p_max - len(p):] = 1
            stamps = _timing_processor()
            if progress is not None:
                useful = iter([sum(1 for i in batch if reqs[i].max_tokens > k) for k in range(n_max)])
                stamps.on_step = lambda: progress.update(next(useful, 0))
            gen_cfg.max_new_tokens = n_max
            out = model.generate(input_ids, attention_mask=mask, generation_config=gen_cfg,
                                 logits_processor=LogitsProcessorList([stamps]))
            end = time.perf_counter() - t0
            rel = [s - t0 for s in stamps.stamps]
            for row, i in enumerate(batch):
                m = reqs[i].max_tokens
                ids[i] = out[row, p_max:p_max + m].tolist()
                token_times[i] = rel[:m]
                done[i] = end
            reserved = len(batch) * (p_max + n_max - 1) * per_token
            used = sum(len(reqs[i].prompt_ids) + reqs[i].max_tokens - 1 for i in batch) * per_token
            reserved_peak, used_peak = max(reserved_peak, reserved), max(used_peak, used)
        makespan, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return RunRecord(
        system=system, workload=workload.name, token_ids=ids, token_times=token_times,
        done_times=done, makespan=makespan, cpu_s=cpu_s, peak_rss=rss.peak, start_rss=rss.start,
        kv={"reserved": reserved_peak, "allocated_peak": reserved_peak, "used_peak": used_peak},
        extra={"batch_size": batch_size, "num_batches": -(-n // batch_size)},
        load_before=load0, load_after=loadavg(),
    )


def warm_up(model, pad_id: int) -> None:
    with torch.inference_mode():
        ids = torch.arange(10, 40)[None]
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                       pad_token_id=pad_id)
