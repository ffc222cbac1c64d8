"""Token sampling from logits with per-row temperature, top-k, top-p, min-p and seeds.

Reproducibility: each seeded request owns a torch.Generator (made once by
`row_sampling` when the request first reaches the runner, and kept by the runner until
the request finishes), and its row draws its noise only from that generator. So a
request's tokens do not depend on which other requests share the batch.

"Greedy" is `engine.core.sampling_params.is_greedy` (defined once, there). The
per-row filter decisions are made from the host-side settings, so sampling a step
costs no device-to-host sync apart from reading back the sampled ids.

Sampling uses the exponential race: argmax(p / E) with E ~ Exp(1) picks index i with
probability p_i, so noise can be drawn per row from that row's generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from engine.core.sampling_params import SamplingParams, is_greedy


@dataclass(slots=True)
class RowSampling:
    """Sampling settings for one logits row (one request's next token)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    logprobs: int | None = None  # None: none; n >= 0: sampled token's + top-n
    generator: torch.Generator | None = None  # per-request; None uses torch's global RNG
    allowed_token_ids: list[int] | None = None  # None: every token
    logit_bias: dict[int, float] | None = None
    prompt_logprobs: int | None = None  # None: none; n >= 0: each prompt token's + top-n

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)


@dataclass(frozen=True, slots=True)
class SamplerOutput:
    """Per row: the sampled id; and where asked, its logprob and the top-n logprobs.

    Logprobs are of the model's raw distribution (log_softmax of unmodified logits),
    as vLLM reports by default, so they do not depend on temperature or filters.
    """

    token_ids: list[int]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded for one request (``0 <= seed < 2**64``); keep it for the
    request's lifetime. `device` must be the device the logits live on.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def row_sampling(params: SamplingParams, seed: int, device: torch.device | str) -> RowSampling:
    """One request's sampling state: its settings and, unless greedy, its own generator."""
    gen = None if params.greedy else make_generator(seed, device)
    return RowSampling(params.temperature, params.top_p, params.top_k, params.min_p,
                       params.logprobs, gen, params.allowed_token_ids, params.logit_bias,
                       params.prompt_logprobs)


def _processed(logits: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
    """vLLM's logits processors that kvscope has, in its order: ``allowed_token_ids``
    masks every other token with -inf, then ``logit_bias`` is added. ``logits`` itself
    when no row asks (the raw logits stay the logprobs' source, as in vLLM)."""
    if all(r.allowed_token_ids is None and not r.logit_bias for r in rows):
        return logits
    out = logits.clone()
    for i, r in enumerate(rows):
        if r.allowed_token_ids is not None:
            keep = torch.tensor(r.allowed_token_ids, device=logits.device)
            masked = torch.full_like(out[i], float("-inf"))
            masked[keep] = out[i, keep]
            out[i] = masked
        if r.logit_bias:
            ids = torch.tensor(list(r.logit_bias), device=logits.device)
            out[i, ids] += torch.tensor(list(r.logit_bias.values()), device=logits.device,
                                        dtype=out.dtype)
    return out


def _filter(logits: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
    """Mask tokens outside each row's top-k / top-p / min-p with -inf. [R, V]"""
    R, V = logits.shape
    dev = logits.device
    # top_k beyond the vocabulary means "off"; clamping on the host keeps huge values
    # out of the int64 tensor (the engine also refuses top_k > vocab at admission)
    ks = [r.top_k if 0 < r.top_k < V else V for r in rows]
    if any(k < V for k in ks) or any(r.top_p < 1 for r in rows):
        top_k = torch.tensor(ks, device=dev)
        top_p = torch.tensor([r.top_p for r in rows], device=dev, dtype=logits.dtype)
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # [R, V]
        rank = torch.arange(V, device=dev).expand(R, V)
        drop = rank >= top_k[:, None]
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass
        # before it already does. The top token always survives.
        mass_before = probs.cumsum(dim=-1) - probs
        drop = drop | (mass_before >= top_p[:, None])
        drop[:, 0] = False
        mask = torch.zeros_like(drop).scatter(-1, order, drop)
        logits = logits.masked_fill(mask, float("-inf"))
    if any(r.min_p > 0 for r in rows):
        min_p = torch.tensor([r.min_p for r in rows], device=dev, dtype=logits.dtype)
        probs = logits.softmax(dim=-1)
        floor = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def _exponential_noise(shape: tuple[int, int], rows: Sequence[RowSampling], device) -> torch.Tensor:
    """Exp(1) noise [R, V]; seeded rows draw only from their own generator."""
    noise = torch.empty(shape, device=device)
    unseeded = [i for i, r in enumerate(rows) if r.generator is None]
    if unseeded:
        noise[unseeded] = torch.empty((len(unseeded), shape[1]), device=device).exponential_()
    for i, row in enumerate(rows):
        if row.generator is not None:
            noise[i].exponential_(generator=row.generator)
    # A zero draw (possible in float32) would make p / E inf or nan; never pick by it.
    return noise.clamp_(min=1e-20)


def _first_max(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)``: the index of each row's first maximum (a NaN counts as the
    maximum), by ``max(dim=-1)``, which gives the same indices ~3x faster on the CPU
    (16 rows of 49152 logits, 2 threads: 0.19 against 0.62 ms; 64 rows 0.84 against 2.27)."""
    return x.max(dim=-1).indices


def sample(logits: torch.Tensor, rows: Sequence[RowSampling]) -> SamplerOutput:
    """Sample one token per row of logits [R, V] (float) under each row's settings."""
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(f"logits {tuple(logits.shape)} do not match {len(rows)} rows")
    raw = logits.float()
    logits = _processed(raw, rows)
    R, V = logits.shape
    token_ids = _first_max(logits)  # [R]; the answer for greedy rows
    random_idx = [i for i, r in enumerate(rows) if not r.greedy]
    if random_idx:
        sub_rows = [rows[i] for i in random_idx]
        temps = torch.tensor([r.temperature for r in sub_rows], device=logits.device)
        scaled = _filter(logits[random_idx] / temps[:, None], sub_rows)
        probs = scaled.softmax(dim=-1)  # [R', V]
        noise = _exponential_noise((len(random_idx), V), sub_rows, logits.device)
        token_ids[random_idx] = _first_max(probs / noise)
    return _with_logprobs(raw, token_ids, rows)


def prompt_logprobs(logits: torch.Tensor, targets: list[int], n: int
                    ) -> list[tuple[int, float, int, tuple[tuple[int, float], ...]]]:
    """Per logits row [P, V] (float), the logprob and rank (1 = most likely) of its
    target token and the top-``n`` alternatives, from the raw distribution (vLLM's
    prompt logprobs)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    tgt = torch.tensor(targets, device=logits.device)[:, None]
    picked = logp.gather(1, tgt)  # [P, 1]
    ranks = (logp > picked).sum(dim=-1).add_(1).tolist()
    picked = picked.squeeze(1).tolist()
    if n:
        vals, ids = logp.topk(min(n, logp.shape[1]), dim=-1)
        tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), vals.tolist())]
    else:
        tops = [()] * len(targets)
    return list(zip(targets, picked, ranks, tops))


def _with_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, rows: Sequence[RowSampling]) -> SamplerOutput:
    ids = token_ids.tolist()
    wanted = [i for i, r in enumerate(rows) if r.logprobs is not None]
    chosen: list[float | None] = [None] * len(rows)
    tops: list[list[tuple[int, float]] | None] = [None] * len(rows)
    if wanted:
        logp = torch.log_softmax(logits[wanted], dim=-1)  # [W, V]
        picked = logp.gather(1, token_ids[wanted][:, None]).squeeze(1).tolist()
        n_max = max(rows[i].logprobs for i in wanted)
        top_vals, top_ids = logp.topk(min(n_max, logp.shape[1]), dim=-1) if n_max else (None, None)
        for j, i in enumerate(wanted):
            chosen[i] = picked[j]
            n = rows[i].logprobs
            tops[i] = (
                list(zip(top_ids[j, :n].tolist(), top_vals[j, :n].tolist())) if n else []
            )
    return SamplerOutput(ids, chosen, tops)
