"""The longest cached prefix of a prompt on one pod: what a KV-cache-aware router computes.

Two ways to find it in a ``PodCacheView``:

- **by hash**, where kvscope can reproduce the source's block hashes. kvscope's own
  publisher sends the low 64 bits of its sha256 chain (``engine.core.hashing``), so
  the prompt's chain is computed and each block looked up. ``detect_scheme`` checks a
  pod's cached root blocks against that chain to see whether it applies. vLLM hashes
  its own serialization with a per-process random seed (unless ``PYTHONHASHSEED`` is
  fixed) and llm-d recomputes its own keys, so neither can be reproduced here.
- **by token ids**, for any source: ``BlockStored`` carries each block's tokens, so
  the trie is walked from a root block (parent None) matching block after block.
  Blocks with equal tokens but other extra keys (LoRA, images) would match too.

``hit_tokens`` is what the engine would actually reuse if the prompt came now: the
cached blocks, but never the prompt's last token (its logits are needed), the rule of
vLLM and kvscope alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.hashing import hash_full_blocks
from engine.events.folds.hash_cache_snapshot import PodCacheView
from engine.events.folds.prefix_tree import PrefixTree
from engine.events.schema.hash_key import hash_key
from engine.kv_events.mapping import vllm_block_hash

KVSCOPE = "kvscope"  # the one hash scheme reproducible here
BY_HASH, BY_TOKENS = "hash", "token ids"


@dataclass(frozen=True, slots=True)
class PodPrefixMatch:
    pod: str
    method: str  # BY_HASH | BY_TOKENS
    block_size: int | None
    num_prompt_tokens: int
    num_blocks: int  # the prompt's leading full blocks cached on the pod
    hashes: tuple[str, ...]  # those blocks' hashes

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * (self.block_size or 0)

    @property
    def hit_tokens(self) -> int:
        """Tokens the engine would take from its cache: never the last prompt token."""
        if not self.block_size or not self.num_prompt_tokens:
            return 0
        return min(self.num_blocks, (self.num_prompt_tokens - 1) // self.block_size) * self.block_size


def kvscope_chain(token_ids: Sequence[int], block_size: int) -> list[str]:
    """The stream hashes kvscope's publisher sends for the prompt's full blocks."""
    return [hash_key(vllm_block_hash(h)) for h in hash_full_blocks(list(token_ids), block_size, [])]


def detect_scheme(pod: PodCacheView, sample: int = 16) -> str | None:
    """``"kvscope"`` when the pod's cached root blocks carry kvscope's hashes, else None."""
    roots = [b for b in pod.blocks if b.parent is None and b.token_ids][:sample]
    if not roots:
        return None
    ok = all(kvscope_chain(b.token_ids, len(b.token_ids)) == [b.hash] for b in roots)
    return KVSCOPE if ok else None


def longest_prefix(pod: PodCacheView, token_ids: Sequence[int], scheme: str | None = None,
                   tree: PrefixTree | None = None) -> PodPrefixMatch:
    """The prompt's longest run of leading full blocks cached on ``pod`` (its main medium).

    ``scheme`` ``"kvscope"`` matches by hash; None matches by token ids."""
    bs = pod.block_size
    tokens = list(token_ids)
    if not bs:
        return PodPrefixMatch(pod.pod, BY_TOKENS if scheme is None else BY_HASH, bs, len(tokens), 0, ())
    tree = tree or PrefixTree(pod)
    found: list[str] = []
    if scheme == KVSCOPE:
        for h in kvscope_chain(tokens, bs):
            if h not in tree.blocks:
                break
            found.append(h)
        return PodPrefixMatch(pod.pod, BY_HASH, bs, len(tokens), len(found), tuple(found))
    candidates = [h for h in tree.roots if tree.blocks[h].parent is None]
    for i in range(len(tokens) // bs):
        want = tuple(tokens[i * bs:(i + 1) * bs])
        nxt = next((h for h in candidates if tree.blocks[h].token_ids == want), None)
        if nxt is None:
            break
        found.append(nxt)
        candidates = tree.children.get(nxt, [])
    return PodPrefixMatch(pod.pod, BY_TOKENS, bs, len(tokens), len(found), tuple(found))
