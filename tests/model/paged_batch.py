"""Hand-built paged batches for model tests: block tables with shuffled physical ids.

Plays the scheduler and block manager in miniature: each sequence gets blocks from a
shuffled free list as it grows, and `step` flattens the chunks scheduled this step
into (input_ids, positions, AttentionMetadata) exactly as the runner will.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.model import AttentionMetadata


@dataclass
class PagedBatchBuilder:
    num_blocks: int
    block_size: int
    seed: int = 0
    free: list[int] = field(init=False)
    tables: dict[str, list[int]] = field(init=False, default_factory=dict)
    computed: dict[str, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        self.free = torch.randperm(self.num_blocks, generator=gen).tolist()

    def step(self, chunks: list[tuple[str, list[int]]]):
        """chunks: (sequence id, new token ids) in batch order.

        Returns input_ids [T], positions [T], meta, and per chunk its row range.
        """
        ids, positions, slots, tables, seq_lens, starts = [], [], [], [], [], [0]
        rows: list[range] = []
        for sid, tokens in chunks:
            table = self.tables.setdefault(sid, [])
            start = self.computed.get(sid, 0)
            end = start + len(tokens)
            while len(table) * self.block_size < end:
                table.append(self.free.pop())
            for pos in range(start, end):
                slots.append(table[pos // self.block_size] * self.block_size + pos % self.block_size)
            rows.append(range(len(ids), len(ids) + len(tokens)))
            ids += tokens
            positions += range(start, end)
            tables.append(table)
            seq_lens.append(end)
            starts.append(starts[-1] + len(tokens))
            self.computed[sid] = end
        width = max(len(t) for t in tables)
        # Pad with -1: entries past a sequence's last block must be ignored.
        block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_tables=block_tables,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            max_query_len=max(len(t) for _, t in chunks),
            max_seq_len=max(seq_lens),
        )
        return torch.tensor(ids, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64), meta, rows
