"""ModelRunner: turns a SchedulerOutput into tensors, runs one forward, samples.

Reads block tables and slot mappings from the scheduler output; never writes
them (the KVCacheManager is their only writer). Owns the K/V cache tensors.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.core.scheduler_output import SchedulerOutput
from engine.model.attention import AttentionBackend, AttentionMetadata
from engine.model.kv_cache import allocate_kv_caches
from engine.model.loader import LoadedModel
from engine.model.sampler import RowSampling, sample

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class SampledToken:
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


class ModelRunner:
    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int,
                 backend: AttentionBackend) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.backend = backend
        self.block_size = block_size
        spec = loaded.spec
        # per layer: ([num_blocks, block_size, num_kv_heads, head_dim],) * 2
        self.kv_caches = allocate_kv_caches(spec.num_layers, num_blocks, block_size,
                                            spec.num_kv_heads, spec.head_dim, loaded.dtype,
                                            self.device)

    def _metadata(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        qsl = [0]
        for s in out.scheduled:
            ids.extend(s.token_ids)
            pos.extend(range(s.start_position, s.seq_len))
            slots.extend(s.slot_mapping)
            seq_lens.append(s.seq_len)
            qsl.append(qsl[-1] + s.num_new_tokens)
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
        )
        return (torch.tensor(ids, dtype=torch.int64, device=dev),
                torch.tensor(pos, dtype=torch.int64, device=dev), meta)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput,
                rows: dict[str, list[RowSampling]]) -> dict[str, list[SampledToken]]:
        """Apply copy-on-write copies, run the forward, sample ``num_samples`` per request.

        ``rows[rid][k]`` are the settings (and generator) of sample k.
        """
        if out.cow_pairs:
            mapping = torch.tensor(out.cow_pairs, dtype=torch.int64, device=self.device)
            self.backend.copy_blocks([k for k, _ in self.kv_caches],
                                     [v for _, v in self.kv_caches], mapping)
        if out.is_empty:
            return {}
        input_ids, positions, meta = self._metadata(out)
        hidden = self.model(input_ids, positions, meta, self.kv_caches, self.backend)
        want = [(i, s) for i, s in enumerate(out.scheduled) if s.num_samples]
        if not want:
            return {}
        last = torch.tensor([meta_end - 1 for meta_end in meta.query_start_loc[1:].tolist()],
                            device=self.device)
        idx = last[[i for i, _ in want]]
        logits = self.model.compute_logits(hidden[idx])  # [R, vocab]
        # a fork point repeats its logits row once per sample
        repeat = torch.tensor([s.num_samples for _, s in want], device=self.device)
        logits = torch.repeat_interleave(logits, repeat, dim=0)
        flat_rows = [r for _, s in want for r in rows[s.request_id][: s.num_samples]]
        res = sample(logits, flat_rows)
        result: dict[str, list[SampledToken]] = {}
        j = 0
        for _, s in want:
            result[s.request_id] = [
                SampledToken(res.token_ids[j + k], res.logprobs[j + k], res.top_logprobs[j + k])
                for k in range(s.num_samples)
            ]
            j += s.num_samples
        return result
