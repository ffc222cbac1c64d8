"""The engine options of the command line, shared by every command that starts an engine
(``kvscope generate``, ``kvscope serve``): ``add_engine_args`` adds them, ``engine_kwargs``
reads them back as EngineConfig fields.

A module of its own so that the subsystems' commands (engine/server/commands.py) need not
import engine.cli, which imports them: the command line is the top of the import graph.
"""

from __future__ import annotations

import argparse
import dataclasses

from engine.core.config import KV_CACHE_DTYPES, QUANTIZATIONS
from engine.core.hashing import DEFAULT_HASH_ALGO, HASH_ALGOS


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine options shared by every command that starts an engine."""
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="smollm2-135m", help="smollm2-135m, a local HF dir or a .gguf file")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-kv-blocks", type=int, default=None, help="pool size in blocks")
    g.add_argument("--kv-cache-memory", type=int, default=None, help="KV budget in bytes")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--max-num-batched-tokens", type=int, default=None, help="token budget per step")
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false")
    g.add_argument("--prefix-caching-hash-algo", choices=HASH_ALGOS, default=DEFAULT_HASH_ALGO,
                   help="how full blocks are hashed: vLLM's sha256 (the default, so KV events carry "
                        "a vLLM pod's hashes for the same tokens), sha256_cbor, or kvscope's own")
    g.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false")
    g.add_argument("--n-sharing", default="cow", choices=["cow", "prefix_cache"],
                   help="how n > 1 samples share KV blocks: cow = copy-on-write forks "
                   "(paper / vLLM v0), prefix_cache = child requests sharing full prompt "
                   "blocks through the prefix cache (vLLM v1)")
    g.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "fair"],
                   help="fcfs = vLLM's arrival order; fair = each client's k-th request before "
                   "anyone's (k+1)-th, preempting the client holding the most sequences when "
                   "another cannot get a seat (serve's default; with one client it is fcfs)")
    g.add_argument("--fair-ratio", type=int, default=0, metavar="R",
                   help="fair only: no client takes more than R times the sequences (and tokens) "
                   "of a step that the lightest client at work could use, so a heavy client "
                   "cannot set a light one's pace (0 = off; serve's default: 2)")
    g.add_argument("--device", default="auto")
    g.add_argument("--dtype", default="auto",
                   help="auto, float32, bfloat16 (on the CPU: bf16 weights; batches of 2+ rows multiplied in "
                        "bf16 where the CPU has AMX or AVX512-BF16, float32 otherwise), float16")
    g.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
                   help="the KV cache's dtype (vLLM's option): auto = the model's; bfloat16 on the CPU halves "
                        "a block's bytes (so twice the blocks in a memory budget)")
    g.add_argument("--quantization", default=None, choices=list(QUANTIZATIONS),
                   help="int8: weight-only int8 linears with float32 compute; w8a8: int8 weights and "
                        "int8-rounded inputs, VNNI dot products at batch 1 (CPU; not the default)")
    g.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    g.add_argument("--num-threads", type=int, default=None,
                   help="CPU torch threads (default: every usable core, or $KVSCOPE_NUM_THREADS; "
                   "serve: $KVSCOPE_SERVE_THREADS; see engine/cpu_threads.py)")
    g.add_argument("--seed", type=int, default=0)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The EngineConfig fields the parsed arguments set (``add_engine_args`` names each
    option after its field, so the config's own field list is the one key list)."""
    from engine.config import EngineConfig

    return {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)
            if hasattr(args, f.name)}
