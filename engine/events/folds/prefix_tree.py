"""PrefixTree: one pod's cached blocks as a trie by parent hash, and its shared prefixes.

Each cached block hangs under its parent. A block whose parent is not cached is a
root: ``rooted`` when its parent is None (the prompt's first block), an orphan
when the parent was evicted or stored before the attach (its subtree starts mid-prompt).
A block with two or more cached children is a branch point: the prefix up to it is
shared by that many continuations. Built from a ``PodCacheView`` for one medium.

Writer: none (built once from a snapshot, then only read).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from engine.events.folds.hash_cache_snapshot import CachedBlockView, PodCacheView


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """The prefix from a root to a branch point, and what hangs below it."""

    hash: str  # the branch point's block
    rooted: bool  # True: starts at the prompt's first block; False: below an evicted block
    num_blocks: int  # blocks from the root to the branch point, both included
    num_tokens: int
    continuations: int  # leaves below: distinct cached continuations of this prefix
    blocks_below: int  # cached blocks under the branch point
    token_ids: tuple[int, ...]  # the prefix's tokens

    @property
    def tokens_shared(self) -> int:
        """Prefix tokens the continuations did not each have to compute: (n - 1) x length."""
        return (self.continuations - 1) * self.num_tokens


def main_medium(pod: PodCacheView) -> str | None:
    """The medium most of the pod's blocks are in (the GPU tier, normally)."""
    counts = Counter(b.medium for b in pod.blocks)
    return counts.most_common(1)[0][0] if counts else None


class PrefixTree:
    def __init__(self, pod: PodCacheView, medium: str | None = None) -> None:
        self.pod = pod
        self.medium = medium if medium is not None else main_medium(pod)
        self.blocks: dict[str, CachedBlockView] = {b.hash: b for b in pod.blocks
                                                   if b.medium == self.medium}
        self.children: dict[str, list[str]] = {}
        self.roots: list[str] = []
        for b in self.blocks.values():
            if b.parent is not None and b.parent in self.blocks:
                self.children.setdefault(b.parent, []).append(b.hash)
            else:
                self.roots.append(b.hash)
        self.depth: dict[str, int] = {}  # 1 for a root
        self.size: dict[str, int] = {}  # blocks in the subtree, itself included
        self.leaves: dict[str, int] = {}  # leaves in the subtree
        order: list[str] = []
        stack = [(r, 1) for r in reversed(self.roots)]
        while stack:  # iterative: a long prompt is a chain thousands of blocks deep
            h, d = stack.pop()
            if h in self.depth:
                continue  # a malformed stream may loop; each block is visited once
            self.depth[h] = d
            order.append(h)
            stack.extend((c, d + 1) for c in reversed(self.children.get(h, ())))
        for h in reversed(order):
            kids = [c for c in self.children.get(h, ()) if c in self.size]
            self.size[h] = 1 + sum(self.size[c] for c in kids)
            self.leaves[h] = sum(self.leaves[c] for c in kids) or 1

    def path(self, h: str) -> list[str]:
        """Hashes from the root down to ``h``."""
        out = [h]
        while (p := self.blocks[out[-1]].parent) is not None and p in self.blocks \
                and len(out) <= len(self.blocks):
            out.append(p)
        return out[::-1]

    def prefix_tokens(self, h: str) -> tuple[int, ...]:
        return tuple(t for x in self.path(h) for t in self.blocks[x].token_ids)

    def shared_prefixes(self, limit: int = 10) -> list[SharedPrefix]:
        """Branch points, the ones that saved the most prefix tokens first."""
        out = []
        for h, kids in self.children.items():
            if len(kids) < 2 or h not in self.depth:
                continue
            path = self.path(h)
            tokens = tuple(t for x in path for t in self.blocks[x].token_ids)
            out.append(SharedPrefix(h, self.blocks[path[0]].parent is None, len(path), len(tokens),
                                    self.leaves[h], self.size[h] - 1, tokens))
        out.sort(key=lambda s: (-s.tokens_shared, -s.num_tokens, s.hash))
        return out[:limit]
