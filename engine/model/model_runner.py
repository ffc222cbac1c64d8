"""ModelRunner: turns a SchedulerOutput into tensors, runs one forward, samples.

Reads block tables and slot mappings from the scheduler output; never writes
them (the KVCacheManager is their only writer). Owns the K/V cache tensors and
every request's sampling state (``RowSampling`` with its torch.Generator), the
writer of both: a request's state is built once, from the ``NewRequestData`` the
scheduler sends when the runner first has to sample for it, and dropped when its id
comes back in ``finished_request_ids`` (vLLM's persistent request states). A
preempted request keeps its state, so its random stream continues where it stopped.

Everything the step needs on the host (positions, the rows to sample from) is
computed from the scheduler output on the host; the only device-to-host copy per
step is reading the sampled token ids back.
"""

from __future__ import annotations

import logging

import torch

from engine.core.model_runner_output import ModelRunnerOutput, PromptTokenLogprob, SampledToken
from engine.core.scheduler_output import SchedulerOutput
from engine.model.attention import AttentionBackend, AttentionMetadata
from engine.model.kv_cache import allocate_kv_caches
from engine.model.loader import LoadedModel
from engine.model.sampler import RowSampling, prompt_logprobs, row_sampling, sample

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int,
                 backend: AttentionBackend, kv_dtype: torch.dtype | None = None) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.backend = backend
        self.block_size = block_size
        spec = loaded.spec
        # per layer: ([num_blocks, block_size, num_kv_heads, head_dim],) * 2, of the model's
        # dtype or ``kv_dtype`` (EngineConfig.kv_cache_dtype)
        self.kv_caches = allocate_kv_caches(spec.num_layers, num_blocks, block_size,
                                            spec.num_kv_heads, spec.head_dim, kv_dtype or loaded.dtype,
                                            self.device)
        self.requests: dict[str, RowSampling] = {}  # per request id: its sampling state

    def _update_states(self, out: SchedulerOutput) -> None:
        for rid in out.finished_request_ids:
            self.requests.pop(rid, None)  # None: finished before it ever reached the runner
        for new in out.new_requests:
            self.requests[new.request_id] = row_sampling(new.params, new.seed, self.device)

    def _prepare(self, out: SchedulerOutput
                 ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int], list[int]]:
        """(input ids [T], positions [T], metadata, the last hidden row of each request
        that samples, and for each sample id the index of its request in that list)."""
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        qsl = [0]
        rows: list[int] = []
        expand: list[int] = []
        for s in out.scheduled:
            ids.extend(s.token_ids)
            pos.extend(range(s.start_position, s.seq_len))
            slots.extend(s.slot_mapping)
            seq_lens.append(s.seq_len)
            qsl.append(qsl[-1] + s.num_new_tokens)
            if s.num_samples:  # a fork point samples each of its ids from the same row
                expand.extend([len(rows)] * s.num_samples)
                rows.append(qsl[-1] - 1)
        width = max(len(s.block_table) for s in out.scheduled)
        tables = [s.block_table + [0] * (width - len(s.block_table)) for s in out.scheduled]
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            max_query_len=max(qsl[i + 1] - qsl[i] for i in range(len(seq_lens))),
            max_seq_len=max(seq_lens),
            seq_lens_cpu=tuple(seq_lens),
            query_start_loc_cpu=tuple(qsl),
            all_slots_valid=True,  # the scheduler gives every new token a slot
        )
        return (torch.tensor(ids, dtype=torch.int64, device=dev),
                torch.tensor(pos, dtype=torch.int64, device=dev), meta, rows, expand)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Update the request states, apply copy-on-write copies, run the forward and
        sample one token per sample id of every scheduled request."""
        self._update_states(out)
        if out.cow_pairs:
            mapping = torch.tensor(out.cow_pairs, dtype=torch.int64, device=self.device)
            self.backend.copy_blocks([k for k, _ in self.kv_caches],
                                     [v for _, v in self.kv_caches], mapping)
        if out.is_empty:
            return ModelRunnerOutput()
        input_ids, positions, meta, rows, expand = self._prepare(out)
        meta = self.backend.plan(meta, self.block_size)  # once per step, for every layer
        hidden = self.model(input_ids, positions, meta, self.kv_caches, self.backend)
        plp = self._prompt_logprobs(out, hidden)
        if not rows:
            return ModelRunnerOutput({}, plp)
        dev = self.device
        logits = self.model.compute_logits(hidden[torch.tensor(rows, device=dev)])  # [R, vocab]
        if len(expand) > len(rows):  # a fork point repeats its row once per sample
            logits = logits[torch.tensor(expand, device=dev)]
        sample_ids = [sid for s in out.scheduled for sid in s.sample_ids]
        res = sample(logits, [self.requests[sid] for sid in sample_ids])
        return ModelRunnerOutput({
            sid: SampledToken(res.token_ids[j], res.logprobs[j],
                              tuple(res.top_logprobs[j]) if res.top_logprobs[j] is not None else None)
            for j, sid in enumerate(sample_ids)
        }, plp)

    def _prompt_logprobs(self, out: SchedulerOutput, hidden: torch.Tensor
                         ) -> dict[str, list[PromptTokenLogprob]]:
        """Prompt logprobs of the requests whose chunk has targets, from the logits of
        their rows (one request at a time: a long prompt's logits are [P, vocab])."""
        found: dict[str, list[PromptTokenLogprob]] = {}
        row = 0
        for s in out.scheduled:
            if s.prompt_logprob_targets:
                first = row + s.prompt_logprobs_from - s.start_position
                logits = self.model.compute_logits(hidden[first:first + len(s.prompt_logprob_targets)])
                n = self.requests[s.request_id].prompt_logprobs or 0
                found[s.request_id] = [PromptTokenLogprob(*e) for e in prompt_logprobs(
                    logits, list(s.prompt_logprob_targets), n)]
            row += s.num_new_tokens
        return found
