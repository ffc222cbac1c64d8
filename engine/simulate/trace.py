"""Request traces for ``kvscope simulate``: what arrives when, with which tokens, for how long.

Past 300 lines on purpose: four readers of one record (``TracedRequest``), sharing its
checks and the synthetic-token rules they all use; the generator lives apart
(``engine.simulate.mooncake``).

Every reader gives ``TracedRequest``s in arrival order. Four sources:

- **JSONL** of requests, one object a line: ``{"timestamp_ms", "token_ids" | "prompt",
  "output_length" | "max_tokens"}`` (``prompt`` needs a tokenizer: ``tokenizer_dir``).
- **Mooncake's FAST'25 trace format** (``kvcache-ai/Mooncake``, ``FAST25-release/``):
  ``{"timestamp" (ms), "input_length", "output_length", "hash_ids"}``, each hash id naming
  one 512-token block of the prompt (equal ids: the same prefix block). Hash ids become
  synthetic token ids (``mooncake_tokens``): equal ids give equal tokens, so the core's own
  block hashing reproduces exactly the sharing the trace describes (docs/simulate.md).
- **A kvscope engine run** in the run store: each request's prompt token ids, the step
  its ``request_arrived`` event came in, its wall-clock arrival and its recorded output
  tokens, so one pod with the run's settings replays the run step for step.
- A run given by id reads from ``RunStore`` (``engine.store``); torch-free.

Output tokens: a trace gives their number; what they are does not matter to the cache
except when a later prompt repeats them, so a simulated request samples a token no other
request samples (``placeholder_token``), or an engine run's own recorded tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

MOONCAKE_BLOCK = 512  # tokens per hash id in Mooncake's traces
SYNTHETIC_VOCAB = 32000  # synthetic token ids are in [1, SYNTHETIC_VOCAB)


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file, the line and the field."""


@dataclass(frozen=True, slots=True)
class TracedRequest:
    """One request of a trace. ``arrival_s``: seconds from the trace's start.
    ``arrival_step``: the engine step it arrived before (engine runs only).
    ``output_token_ids``: the tokens to sample (engine runs), else placeholders.
    ``finish``: how it ended: ``length`` (after ``output_length`` tokens), ``stop`` (its
    last token was a stop token), ``stop_string`` or ``abort``: the engine ended it before
    step ``finish_step`` (a stop string is matched after the step that made it).
    ``client``: the fair policy's unit."""

    request_id: str
    arrival_s: float
    prompt_token_ids: tuple[int, ...] | None  # None: made from ``hash_ids`` when needed
    output_length: int
    arrival_step: int | None = None
    output_token_ids: tuple[int, ...] | None = None
    finish: str = "length"
    finish_step: int | None = None
    client: str = ""
    hash_ids: tuple[int, ...] | None = None  # Mooncake's, for a prompt of num_prompt_tokens
    num_prompt_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_token_ids is not None:
            object.__setattr__(self, "num_prompt_tokens", len(self.prompt_token_ids))

    def tokens(self) -> list[int]:
        """The prompt's token ids (a Mooncake record's are made now, not kept: a fleet
        trace's prompts do not fit in memory at once)."""
        if self.prompt_token_ids is not None:
            return list(self.prompt_token_ids)
        return mooncake_tokens(list(self.hash_ids), self.num_prompt_tokens)


@dataclass(frozen=True, slots=True)
class Trace:
    """Requests in arrival order, where they came from (``source``), the settings of the
    run they came from (an engine run's config, else empty) and what the reader could
    not see (``notes``, printed with the report)."""

    requests: tuple[TracedRequest, ...]
    source: str
    config: dict[str, Any]
    notes: tuple[str, ...] = ()


def mix(a: int, b: int) -> int:
    """A 64-bit integer hash of two integers (splitmix64's finalizer), fixed forever: the
    synthetic token of Mooncake hash id ``a`` at position ``b`` of its block."""
    z = (a * 0x9E3779B97F4A7C15 + b * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def mooncake_tokens(hash_ids: list[int], input_length: int, block: int = MOONCAKE_BLOCK) -> list[int]:
    """The prompt a Mooncake record describes: block ``j`` is ``block`` tokens made from
    ``hash_ids[j]`` alone (token ``i`` = ``1 + mix(id, i) % (SYNTHETIC_VOCAB - 1)``), and the
    last block is cut to what ``input_length`` leaves. (``mix`` in numpy, all blocks at once.)"""
    import numpy as np

    need = -(-input_length // block)
    if len(hash_ids) != need:
        raise TraceError(f"{len(hash_ids)} hash_ids for input_length {input_length}: "
                         f"{block}-token blocks need {need}")
    ids = np.array(hash_ids, dtype=np.uint64)[:, None]
    pos = np.arange(block, dtype=np.uint64)[None, :]
    return _shared_ints(_synthetic_np(ids, pos).ravel()[:input_length])


def _synthetic_np(a, b):
    """``1 + mix(a, b) % (SYNTHETIC_VOCAB - 1)`` on uint64 arrays (broadcast)."""
    import numpy as np

    u = np.uint64
    with np.errstate(over="ignore"):
        z = a * u(0x9E3779B97F4A7C15) + b * u(0xBF58476D1CE4E5B9) + u(0x94D049BB133111EB)
        z = (z ^ (z >> u(30))) * u(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> u(27))) * u(0x94D049BB133111EB)
        z = z ^ (z >> u(31))
    return u(1) + z % u(SYNTHETIC_VOCAB - 1)


_INTS = None  # the int objects 0 .. SYNTHETIC_VOCAB - 1, as an object array


def _shared_ints(tokens) -> list[int]:
    """``tokens.tolist()`` with one int object per token id for the whole process: a
    fleet's queued prompts (144M tokens) hold 8-byte references, not 28-byte ints each."""
    global _INTS
    import numpy as np

    if _INTS is None:
        _INTS = np.array(list(range(SYNTHETIC_VOCAB)), dtype=object)
    return _INTS[tokens.astype(np.intp)].tolist()


def placeholder_token(request_index: int) -> int:
    """What a simulated request samples at every output position its trace records no
    token for: one token id per request, no two requests of a trace under 32,000 requests
    alike (a block of them hashes apart from any other's, its parent chain being the
    request's own), so output blocks are stored and evicted as a stream would be, and the
    runner's samples are the same objects step after step (no per-step work)."""
    return 1 + request_index % (SYNTHETIC_VOCAB - 1)


# ---- readers --------------------------------------------------------------------------


def _lines(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}:{i}: not JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{path}:{i}: a line must be a JSON object")
            yield i, obj


def _int(obj: dict, key: str, where: str, lo: int) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise TraceError(f"{where}: {key!r} must be an integer >= {lo}, got {v!r}")
    return v


def _time_ms(obj: dict, key: str, where: str) -> float:
    v = obj.get(key, 0)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
        raise TraceError(f"{where}: {key!r} must be a number of milliseconds >= 0, got {v!r}")
    return v / 1000.0


def _sorted(reqs: list[TracedRequest]) -> tuple[TracedRequest, ...]:
    return tuple(sorted(reqs, key=lambda r: r.arrival_s))  # stable: ties keep file order


def is_mooncake(obj: dict[str, Any]) -> bool:
    return "hash_ids" in obj and "input_length" in obj


def read_mooncake(path: Path) -> Trace:
    reqs = []
    for i, obj in _lines(path):
        where = f"{path}:{i}"
        n = _int(obj, "input_length", where, 1)
        ids = obj.get("hash_ids")
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                and 0 <= h < 1 << 64 for h in ids):
            raise TraceError(f"{where}: 'hash_ids' must be a list of integers in [0, 2**64)")
        if len(ids) != -(-n // MOONCAKE_BLOCK):
            raise TraceError(f"{where}: {len(ids)} hash_ids for input_length {n}: "
                             f"{MOONCAKE_BLOCK}-token blocks need {-(-n // MOONCAKE_BLOCK)}")
        reqs.append(TracedRequest(f"r{len(reqs)}", _time_ms(obj, "timestamp", where), None,
                                 max(1, _int(obj, "output_length", where, 0)),
                                 hash_ids=tuple(ids), num_prompt_tokens=n))
    return Trace(_sorted(reqs), f"mooncake:{path}", {})


def read_jsonl(path: Path, tokenizer_dir: str | None = None) -> Trace:
    """The generic JSONL (see the module docstring); a Mooncake file is recognised by its
    first record's fields."""
    tokenizer = None
    reqs = []
    for i, obj in _lines(path):
        if not reqs and is_mooncake(obj):
            return read_mooncake(path)
        where = f"{path}:{i}"
        if "token_ids" in obj:
            ids = obj["token_ids"]
            if not isinstance(ids, list) or not ids or not all(
                    isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise TraceError(f"{where}: 'token_ids' must be a non-empty list of integers >= 0")
        elif isinstance(obj.get("prompt"), str):
            if tokenizer is None:
                if tokenizer_dir is None:
                    raise TraceError(f"{where}: a 'prompt' needs a tokenizer (--tokenizer DIR); "
                                     f"or give 'token_ids'")
                from engine.tokenizer import Tokenizer

                tokenizer = Tokenizer(tokenizer_dir)
            ids = tokenizer.encode(obj["prompt"])
        else:
            raise TraceError(f"{where}: a request needs 'token_ids' (a list) or 'prompt' (text)")
        key = "output_length" if "output_length" in obj else "max_tokens"
        out = _int(obj, key, where, 1)
        reqs.append(TracedRequest(str(obj.get("request_id") or f"r{len(reqs)}"),
                                 _time_ms(obj, "timestamp_ms", where), tuple(ids), out,
                                 client=str(obj.get("client") or "")))
    if not reqs:
        raise TraceError(f"{path}: no requests")
    return Trace(_sorted(reqs), f"jsonl:{path}", {})


ATTACHED_NOTE = ("rebuilt from the pods' BlockStored chains: a lower bound. A request that "
                 "hit every block it needed stored nothing and is missing; a batch extending the "
                 "last block of an earlier one is taken for that request's next chunk; outputs "
                 "are one token; a chain stored before the attach starts where the stream does")


def read_attached_run(store: Any, run_id: str) -> Trace:
    """An attached run's requests, rebuilt from its ``kv_block_stored`` events: each batch
    is a request whose prompt is its chain's known tokens from the root (``ATTACHED_NOTE``
    says what this cannot see)."""
    run = store.get_run(run_id)
    tokens_of: dict[str, tuple[int, ...]] = {}
    parent_of: dict[str, str | None] = {}
    tips: dict[tuple[str, str], list] = {}  # (pod, last hash) -> [arrival, hashes, pod]
    reqs: list[list] = []
    block_size = None
    t0 = None
    for rec in store.load_steps(run_id):
        for e in rec.events:
            if e.type != "kv_block_stored" or not e.block_hashes:
                continue
            t0 = e.ts if t0 is None else t0
            if block_size not in (None, e.block_size):
                raise TraceError(f"run {run_id}: blocks of {block_size} and {e.block_size} tokens")
            block_size = e.block_size
            for i, h in enumerate(e.block_hashes):
                tokens_of[h] = e.block_tokens(i)
                parent_of[h] = e.parent_hash if i == 0 else e.block_hashes[i - 1]
            key = (e.pod, e.parent_hash)
            if e.parent_hash is not None and key in tips:  # the same request's next chunk
                r = tips.pop(key)
                r[1].extend(e.block_hashes)
            else:
                chain: list[str] = []
                h = e.parent_hash
                while h is not None and h in tokens_of and len(chain) < 1 << 16:
                    chain.append(h)
                    h = parent_of[h]
                r = [e.ts - t0, chain[::-1] + list(e.block_hashes), e.pod]
                reqs.append(r)
            tips[(e.pod, e.block_hashes[-1])] = r
    if not reqs:
        raise TraceError(f"run {run_id} holds no BlockStored events to rebuild requests from")
    out = [TracedRequest(f"{pod}/{i}", max(0.0, ts), tuple(t for h in hashes for t in tokens_of[h]) + (0,), 1,
                        client=pod)
           for i, (ts, hashes, pod) in enumerate(reqs)]
    out.sort(key=lambda r: r.arrival_s)
    return Trace(tuple(out), f"attached:{run_id}", {"block_size": block_size}, (ATTACHED_NOTE,))


def read_run(store: Any, run_id: str) -> Trace:
    """A recorded run of either kind."""
    kind = store.get_run(run_id).get("kind") or "engine"
    if kind == "attached":
        return read_attached_run(store, run_id)
    return read_engine_run(store, run_id)


def read_engine_run(store: Any, run_id: str) -> Trace:
    """An engine run's requests, from its events: ``request_arrived`` (the prompt, and the
    step it was entered before), ``request_progress`` (the sampled tokens, and the step of
    the last), ``request_finished`` (how and when it ended); the client from its row."""
    run = store.get_run(run_id)
    if (run.get("kind") or "engine") != "engine":
        raise TraceError(f"run {run_id} is a {run.get('kind')} run: only engine runs replay "
                         f"step for step")
    arrived: dict[str, tuple[int, float, tuple[int, ...]]] = {}
    tokens: dict[str, list[int]] = {}
    last_sampled: dict[str, int] = {}
    finished: dict[str, tuple[str, int]] = {}
    t0 = None
    for rec in store.load_steps(run_id):
        t0 = rec.ts if t0 is None else t0
        for e in rec.events:
            if e.type == "request_arrived":
                if e.parent_id is not None:
                    raise TraceError(f"run {run_id}: request {e.parent_id} has n > 1; "
                                     f"simulating n > 1 is not supported yet")
                if len(e.prompt_token_ids) != e.num_prompt_tokens:
                    raise TraceError(f"run {run_id}: its events carry no prompt tokens")
                arrived[e.request_id] = (e.step, rec.ts, tuple(e.prompt_token_ids))
                tokens[e.request_id] = []
            elif e.type == "request_forked":
                raise TraceError(f"run {run_id}: request {e.parent_id} has n > 1; "
                                 f"simulating n > 1 is not supported yet")
            elif e.type == "request_progress" and e.new_token_ids and e.request_id in tokens:
                tokens[e.request_id].extend(e.new_token_ids)
                last_sampled[e.request_id] = e.step
            elif e.type == "request_finished" and e.request_id in tokens:
                finished[e.request_id] = (e.reason, e.step)
    clients = {r["request_id"]: f"{r.get('source') or 'websocket'}:{(r.get('timings') or {}).get('connection', '')}"
               for r in store.load_requests(run_id)}
    reqs = []
    for rid, (step, ts, prompt) in arrived.items():
        out = tokens[rid]
        reason, at = finished.get(rid, ("abort", None))
        if reason == "stop" and at != last_sampled.get(rid):
            reason = "stop_string"  # ended by the step after its last token's
        reqs.append(TracedRequest(rid, max(0.0, ts - (t0 or ts)), prompt, len(out), step, tuple(out),
                                 reason, at if reason in ("stop_string", "abort") else None,
                                 clients.get(rid, "")))
    reqs.sort(key=lambda r: (r.arrival_step, r.arrival_s))
    return Trace(tuple(reqs), f"run:{run_id}", dict(run.get("config") or {}))
