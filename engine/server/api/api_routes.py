"""The OpenAI routes (Starlette): ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` and vLLM's ``POST /reset_prefix_cache``.

A call is checked in this order: Origin (403), token (401, ``Authorization: Bearer``
with the server's ``KVSCOPE_TOKEN``), body (413 / 400), the engine's state (503 while
loading or stopping), the model (404), the client address's quota of requests in
flight (429 ``too_many_in_flight``, ``client_quota``), then submitted; the engine's refusals come
back as 400 (a prompt that does not fit says by how much) or 429 (queue full). Only
then does a stream start, so every refusal is a plain HTTP error.

Every answer carries ``x-kvscope-request-id`` (the engine request id, as on the Live
and Replay pages; a list of prompts runs as ``<id>-0``, ``<id>-1``, ...) and
``x-kvscope-run-id``. A client that goes away mid-call has its requests aborted.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from engine.openai import sse
from engine.openai.choices import Assembler
from engine.openai.errors import ApiError, from_engine
from engine.openai.request import ApiRequest, Endpoint, ParseLimits, check_model, parse_chat, parse_completion
from engine.openai.token_strings import TokenStrings
from engine.protocol.messages import Error, Ok
from engine.protocol.ops import ResetPrefixCache
from engine.server.api.api_desk import ApiDesk, Exchange
from engine.server.api.client_quota import ClientQuota
from engine.server.worker.health import HealthBoard, Status
from engine.server.port.http import CHALLENGE, Gate

REQUEST_ID_HEADER = "x-kvscope-request-id"
RUN_ID_HEADER = "x-kvscope-run-id"


class ClientGone(Exception):
    """The HTTP client disconnected before the answer was ready."""


def error_response(exc: ApiError) -> Response:
    return JSONResponse(exc.body(), exc.status, CHALLENGE if exc.status == 401 else None)


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(request: Request, work: Awaitable[Any]) -> Any:
    """``await work``, unless the client disconnects first (ClientGone)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise ClientGone
    return task.result()


class _Stream(StreamingResponse):
    """A streaming response that runs ``on_close`` however the stream ends (finished,
    client gone, send failed), so the exchange is always closed at once."""

    def __init__(self, body: AsyncIterator[bytes], on_close: Callable[[], None], **kw: Any) -> None:
        super().__init__(body, **kw)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


@dataclass(slots=True)
class ApiContext:
    desk: ApiDesk
    board: HealthBoard
    gate: Gate
    limits: ParseLimits
    max_body_bytes: int
    # The names the API answers to (vLLM's --served-model-name, else --model): listed by
    # /v1/models, the only accepted ``model`` values; the first one names answers and
    # labels the Prometheus series (ServerOptions.model_name).
    names: tuple[str, ...]
    quota: ClientQuota
    _strings: TokenStrings | None = None
    _strings_path: str | None = None

    def strings(self) -> TokenStrings:
        """Token strings for the running engine's tokenizer (reloaded if it changes)."""
        path = self.board.current.config.get("tokenizer_file")
        if self._strings is None or self._strings_path != path:
            self._strings, self._strings_path = TokenStrings(path), path
        return self._strings

    # ---- checks ---------------------------------------------------------------------

    def admit(self, request: Request) -> None:
        if not self.gate.origin_ok(request):
            raise ApiError(403, "requests from a page of another site are refused (Origin "
                                f"{request.headers.get('origin')!r})", code="origin_not_allowed")
        if not self.gate.authorized(request):
            raise ApiError(401, "present the server token (KVSCOPE_TOKEN) as Authorization: Bearer "
                                "(the OpenAI client's api_key)", code="invalid_api_key")

    def ready(self) -> Any:
        health = self.board.current
        if self.desk.hub.stopping or health.status is Status.STOPPING:
            raise ApiError(503, "the server is shutting down", "server_error", None, "shutting_down")
        if health.status is Status.LOADING:
            raise ApiError(503, f"the model is still loading ({health.detail}); retry shortly",
                           "server_error", None, "loading")
        if not health.serving:  # ready, or degraded (a recorder problem): both serve
            raise ApiError(503, f"the engine is not serving: {health.detail}", "server_error", None,
                           "unavailable")
        return health

    async def body(self, request: Request) -> Any:
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json":  # vLLM's rule and words (validate_json_request)
            raise ApiError(400, "Unsupported Media Type: Only 'application/json' is allowed",
                           param=None)
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.max_body_bytes:
            raise self._too_large(int(size))
        parts, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > self.max_body_bytes:
                raise self._too_large(total)
            parts.append(chunk)
        try:
            return json.loads(b"".join(parts))
        except ValueError as exc:
            raise ApiError(400, f"the body is not valid JSON: {exc}") from None

    def _too_large(self, size: int) -> ApiError:
        return ApiError(413, f"the body has {size} bytes; this server takes at most "
                             f"{self.max_body_bytes} (--max-frame-bytes)", code="request_too_large")


def _headers(rid: str, health) -> dict[str, str]:
    return {REQUEST_ID_HEADER: rid, RUN_ID_HEADER: str(health.run_id)}


async def models(ctx: ApiContext, request: Request) -> Response:
    ctx.admit(request)
    health = ctx.ready()
    cfg = health.config
    data = [{"id": name, "object": "model", "created": int(ctx.board.started), "owned_by": "kvscope",
             "root": cfg.get("model", name), "parent": None,
             "max_model_len": cfg.get("max_model_len"), "permission": []}
            for name in ctx.names]
    return JSONResponse({"object": "list", "data": data})


async def health(ctx: ApiContext, request: Request) -> Response:
    """vLLM's liveness probe: 200 with an empty body while the engine serves, else 503
    (kvscope's own ``/healthz`` says why)."""
    try:
        ctx.ready()
    except ApiError:
        return Response(status_code=503)
    return Response(status_code=200)


async def reset_prefix_cache(ctx: ApiContext, request: Request) -> Response:
    ctx.admit(request)
    ctx.ready()
    ex = ctx.desk.open()
    try:
        ex.send(ResetPrefixCache())
        reply = await ex.reply()
    finally:
        ctx.desk.close(ex)
    if isinstance(reply, Error):
        raise from_engine(reply)
    return JSONResponse(reply.result if isinstance(reply, Ok) else {})


async def _submit(ex: Exchange, req: ApiRequest, rid: str) -> list[str]:
    """Prepare and queue the call's engine requests (one per prompt); returns their ids."""
    if req.endpoint is Endpoint.CHAT:
        items: list = [(rid, None, list(req.messages))]
    elif len(req.prompts) == 1:
        items = [(rid, req.prompts[0], None)]
    else:
        items = [(f"{rid}-{i}", p, None) for i, p in enumerate(req.prompts)]
    for r, prompt, messages in items:
        await ex.submit(prompt, messages, req.params, r, (req.truncate, req.truncation_side))
    return [r for r, _, _ in items]


def _client(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


async def generate(ctx: ApiContext, request: Request, endpoint: Endpoint) -> Response:
    ctx.admit(request)
    body = await ctx.body(request)
    parse = parse_chat if endpoint is Endpoint.CHAT else parse_completion
    req = parse(body, ctx.limits)
    health = ctx.ready()
    check_model(req.model, ctx.names)
    client, held = _client(request), req.num_requests
    ctx.quota.take(client, held)
    rid = f"{'chatcmpl' if endpoint is Endpoint.CHAT else 'cmpl'}-{secrets.token_hex(12)}"
    ex = ctx.desk.open(client)

    def close() -> None:  # once, however the call ends: the stream's end, or below
        ctx.desk.close(ex)
        ctx.quota.give_back(client, held)

    streaming = False
    try:
        rids = await _unless_gone(request, _submit(ex, req, rid))
        await _unless_gone(request, ex.accept_all())
        asm = Assembler(req, rids, rid, req.model or ctx.names[0], int(time.time()), ctx.strings())
        if req.stream:
            streaming = True
            return _Stream(_events(ex, asm), close, media_type=sse.MEDIA_TYPE,
                           headers={**_headers(rid, health), "Cache-Control": "no-cache"})
        await _unless_gone(request, _finish(ex, asm))
        return JSONResponse(asm.body(), headers=_headers(rid, health))
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; the requests are aborted below
    finally:
        if not streaming:
            close()


async def _finish(ex: Exchange, asm: Assembler) -> None:
    while not asm.done:
        for up in await ex.updates():
            asm.note(up)
        errors = ex.take_errors()
        if errors:
            raise from_engine(errors[0])


async def _events(ex: Exchange, asm: Assembler) -> AsyncIterator[bytes]:
    yield sse.events(asm.opening(ex.prompt_ids))
    while not asm.done:
        ups = await ex.updates()
        out = b"".join(sse.events(asm.chunks(up)) for up in ups)
        for err in ex.take_errors():  # an engine fault mid-stream: say so; the abort follows
            out += sse.event(from_engine(err).body())
        if out:
            yield out
    if asm.req.include_usage:
        yield sse.event(asm.usage_chunk())
    yield sse.DONE


def api_routes(ctx: ApiContext) -> list[BaseRoute]:
    def bind(fn, *args):
        async def endpoint(request: Request) -> Response:
            try:
                return await fn(ctx, request, *args)
            except ApiError as exc:  # every refusal, in OpenAI's shape (the port's other
                return error_response(exc)  # routes answer in their own)
        return endpoint

    return [Route("/v1/models", bind(models), methods=["GET"]),
            Route("/v1/completions", bind(generate, Endpoint.COMPLETIONS), methods=["POST"]),
            Route("/v1/chat/completions", bind(generate, Endpoint.CHAT), methods=["POST"]),
            Route("/reset_prefix_cache", bind(reset_prefix_cache), methods=["POST"]),
            Route("/health", bind(health), methods=["GET"])]
