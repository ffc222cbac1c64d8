"""ApiDesk and Exchange: HTTP API calls as sinks of the engine thread's mailbox (loop thread).

An API call is an ``Exchange``, a ``Sink`` of source ``openai``. How its Submits reach
the engine thread (the websocket door's way), how its outputs are coalesced and how its
end aborts what is still live (``Detach``, queued behind its own Submits in the FIFO
mailbox, so not even a queued request outlives its caller): docs/architecture.md, "Front
doors" (OpenAI HTTP). Coalescing keeps the latest RequestOutput of a request and joins
the deltas in between, so memory per exchange stays bounded by its requests' own
outputs; reading the latest is safe after the engine moved on (``engine.outputs``: a
sample's token ids and logprobs only grow, and the Assembler slices them by position).

Writer: the loop thread only (``Hub.deliver`` calls ``Exchange.deliver``; the route
handlers call the rest).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, ClassVar

from engine.core.sampling_params import SamplingParams
from engine.openai.choices import Update
from engine.openai.context_length import check_fits
from engine.openai.errors import ApiError, from_engine
from engine.outputs import RequestOutput
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.messages import Accepted, Error, Message
from engine.protocol.ops import Op, Submit
from engine.server.worker.mailbox import Detach, Prepared
from engine.server.worker.prompt_prep import PromptPrep
from engine.server.worker.sink import Sink, SinkItem, Source

if TYPE_CHECKING:
    from engine.server.websocket.hub import Hub

LIVENESS_POLL_S = 1.0  # how often a waiting handler checks that the engine thread still runs


class Exchange(Sink):
    """One API call's sink (see module docstring)."""

    source: ClassVar[Source] = Source.OPENAI

    def __init__(self, desk: ApiDesk, sink_id: int, client: str) -> None:
        self.desk = desk
        self.id = sink_id
        self.client = client  # the caller's address: its calls share one scheduling share
        self.closed = False
        self.rids: list[str] = []
        self.accepted: set[str] = set()
        self.refusal: Error | None = None  # the first error before every request was accepted
        self.late_errors: list[Error] = []  # errors after acceptance (an engine fault)
        self.replies: list[Message] = []  # ok / error for control ops
        self.prompt_ids: dict[str, list[int]] = {}  # request id -> its prepared prompt's tokens
        # request id -> (latest output, per sample: delta texts and token ids since last look)
        self._pending: dict[str, tuple[RequestOutput, dict[int, tuple[list[str], list[int]]]]] = {}
        self._wake = asyncio.Event()

    def client_key(self) -> str:
        return f"{self.source.value}:{self.client}"

    # ---- into the engine --------------------------------------------------------------

    async def submit(self, prompt: str | list[int] | None, messages: list[dict[str, str]] | None,
                     params: SamplingParams, request_id: str,
                     truncate: tuple[int | None, str] = (None, "left")) -> None:
        """Prepare and queue one engine request: 400 for a prompt the preparation refuses
        (too long, too many bytes, a bad role or token id, empty), 429 when the engine's
        mailbox is full, 503 once the server is stopping. ``truncate``: vLLM's
        ``truncate_prompt_tokens`` and ``truncation_side``."""
        hub = self.desk.hub
        if hub.prep is None and truncate[0] is not None:  # only a prepared prompt can be cut
            raise ApiError(503, "the model is still loading; retry shortly", "server_error",
                           None, "loading")
        try:  # the protocol's own checks (a chat of empty messages), then the prep's
            cmd = await hub.prepare(Submit(prompt, messages, params, request_id),
                                    partial(_prepare, truncate=truncate))
        except ProtocolError as exc:
            raise from_engine(exc) from None
        self.send(cmd)
        self.rids.append(request_id)
        if isinstance(cmd, Prepared):
            self.prompt_ids[request_id] = cmd.token_ids

    def send(self, cmd: Op | Prepared) -> None:
        try:
            self.desk.hub.post(self, cmd)
        except ProtocolError as exc:  # busy, shutting down
            raise from_engine(exc) from None

    # ---- from the engine (loop thread) -------------------------------------------------

    def deliver(self, item: SinkItem) -> None:
        if self.closed:
            return  # the call is over; its Detach is on its way to the engine thread
        if isinstance(item, RequestOutput):
            merged = self._pending[item.request_id][1] if item.request_id in self._pending else {}
            for k, (text, ids) in item.deltas.items():
                texts, tokens = merged.setdefault(k, ([], []))
                texts.append(text)
                tokens.extend(ids)
            self._pending[item.request_id] = (item, merged)
        elif isinstance(item, Accepted):
            self.accepted.add(item.request_id)
        elif isinstance(item, Error) and item.request_id in self.rids:
            if item.request_id in self.accepted:
                self.late_errors.append(item)
            elif self.refusal is None:
                self.refusal = item
        else:
            self.replies.append(item)
        self._wake.set()

    # ---- waiting (the route handler) ------------------------------------------------

    async def _wait(self, ready: Callable[[], bool]) -> None:
        while not ready():
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), LIVENESS_POLL_S)
            except asyncio.TimeoutError:
                if not self.desk.alive():
                    raise ApiError(500, "the engine thread has stopped; see the server log",
                                   "server_error", None, ErrorCode.INTERNAL) from None

    async def accept_all(self) -> None:
        """Wait until the engine accepted every request of this call; raises the first
        refusal (the others are aborted when the exchange closes)."""
        await self._wait(lambda: self.refusal is not None or len(self.accepted) == len(self.rids))
        if self.refusal is not None:
            raise from_engine(self.refusal)

    async def updates(self) -> list[Update]:
        """Everything that arrived since the last call (waits for something)."""
        await self._wait(lambda: bool(self._pending or self.late_errors))
        ups = [Update(out, {k: ("".join(t), ids) for k, (t, ids) in merged.items()})
               for out, merged in self._pending.values()]
        self._pending.clear()
        return ups

    def take_errors(self) -> list[Error]:
        errs, self.late_errors = self.late_errors, []
        return errs

    async def reply(self) -> Message:
        """The engine's answer to a control op."""
        await self._wait(lambda: bool(self.replies))
        return self.replies.pop(0)


def _prepare(prep: PromptPrep, op: Submit, truncate: tuple[int | None, str]) -> Prepared:
    """``op`` tokenized, truncated as asked, then held to vLLM's context-length rule (a
    worker thread)."""
    keep, side = truncate
    if keep is not None and keep > prep.max_model_len:
        raise ApiError(400, f"truncate_prompt_tokens={keep} cannot be greater than max_model_len "
                            f"= {prep.max_model_len}. Please request a smaller truncation size.",
                       param="truncate_prompt_tokens")
    prepared = prep.tokenized(op)
    if keep is not None:
        keep = prep.max_model_len - 1 if keep < 0 else keep  # -1: all that leaves room to answer
        ids = prepared.token_ids
        if keep < len(ids):
            ids = ids[len(ids) - keep:] if side == "left" else ids[:keep]
            prepared = Prepared(op, None, ids)  # the text no longer is the prompt's
    check_fits(len(prepared.token_ids), op.params.max_tokens, prep.max_model_len)
    return prepared


class ApiDesk:
    """Opens and closes exchanges; knows which are open (``/healthz``, shutdown)."""

    def __init__(self, hub: Hub, alive: Callable[[], bool] = lambda: True) -> None:
        self.hub = hub  # the way into the engine thread, shared with the websocket door
        self.alive = alive  # False once the engine thread is gone
        self.exchanges: dict[int, Exchange] = {}

    def open(self, client: str = "unknown") -> Exchange:
        ex = Exchange(self, self.hub.mailbox.new_sink_id(), client)
        self.exchanges[ex.id] = ex
        return ex

    def close(self, ex: Exchange) -> None:
        """End an exchange; whatever of it is still live in the engine is aborted."""
        if self.exchanges.pop(ex.id, None) is None:
            return
        ex.closed = True
        if ex.rids:
            self.hub.mailbox.send_lifecycle(ex, Detach())
