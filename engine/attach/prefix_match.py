"""The longest cached prefix of a prompt on one pod: what a KV-cache-aware router computes.

Two ways to find it in a ``PodCacheView``:

- **by hash**, where kvscope can reproduce the source's block hashes: vLLM's
  ``sha256`` (its default) and ``sha256_cbor`` with the fixed root seed
  ``"vllm-none-hash"`` (vLLM >= 0.3x, ``PYTHONHASHSEED`` unset in the pod and here),
  and kvscope's own ``kvscope`` algorithm (``engine.core.hashing``; a stream sends a
  digest's low 64 bits). The prompt's chain is computed and each block looked up.
  ``detect_scheme`` checks a pod's cached root blocks against each algorithm's chain
  to see which applies (tests/vllm/test_attach_vllm.py: a real vLLM 0.32 pod is
  ``sha256``, and the prediction equals the ``cached_tokens`` it then serves). A pod
  with another seed, vLLM's xxhash algorithms or extra keys (LoRA, images, salt) is
  not reproducible here; llm-d recomputes its own keys.
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

from engine.core.hashing import HASH_ALGOS, hash_full_blocks
from engine.events.folds.hash_cache_snapshot import PodCacheView
from engine.events.folds.prefix_tree import PrefixTree
from engine.events.schema.hash_key import hash_key
from engine.kv_events.mapping import vllm_block_hash

SCHEMES = HASH_ALGOS  # the hash schemes reproducible here: engine.core.hashing's algorithms
KVSCOPE, SHA256 = "kvscope", "sha256"
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


def stream_chain(token_ids: Sequence[int], block_size: int, scheme: str = SHA256) -> list[str]:
    """The stream hashes a publisher hashing with ``scheme`` sends for the prompt's full blocks."""
    return [hash_key(vllm_block_hash(h))
            for h in hash_full_blocks(list(token_ids), block_size, [], algo=scheme)]


def detect_scheme(pod: PodCacheView, sample: int = 16) -> str | None:
    """The scheme (one of ``SCHEMES``) whose hashes the pod's cached root blocks carry, else None."""
    roots = [b for b in pod.blocks if b.parent is None and b.token_ids][:sample]
    if not roots:
        return None
    for scheme in SCHEMES:
        if all(stream_chain(b.token_ids, len(b.token_ids), scheme) == [b.hash] for b in roots):
            return scheme
    return None


def longest_prefix(pod: PodCacheView, token_ids: Sequence[int], scheme: str | None = None,
                   tree: PrefixTree | None = None) -> PodPrefixMatch:
    """The prompt's longest run of leading full blocks cached on ``pod`` (its main medium).

    ``scheme`` (one of ``SCHEMES``) matches by hash; None matches by token ids."""
    bs = pod.block_size
    tokens = list(token_ids)
    if not bs:
        return PodPrefixMatch(pod.pod, BY_TOKENS if scheme is None else BY_HASH, bs, len(tokens), 0, ())
    tree = tree or PrefixTree(pod)
    found: list[str] = []
    if scheme is not None:
        for h in stream_chain(tokens, bs, scheme):
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
