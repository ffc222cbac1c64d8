"""The attach server's own HTTP routes, next to the front door's websocket, /healthz, /metrics.

- ``POST /locate``: the prefix locator (``engine.attach.locator``) for scripts. The body is
  ``{"prompt": "text"}`` (tokenized with ``--tokenizer``; ``"add_special_tokens"``, default
  true, as vLLM's completions API) or ``{"token_ids": [1, 2, ...]}``; the answer is
  ``{"step", "prompt_tokens", "pods": [{"pod", "tier", "cached_blocks", "cached_tokens",
  "hit_tokens", "break": {"reason", "block", "token", "detail", ...}, "tiers": [...]}]}``.
  What it cannot answer is a 400 naming the problem (no JSON, both or neither of
  ``prompt`` / ``token_ids``, a text prompt without ``--tokenizer``, a bad token id, a
  body over ``MAX_BODY_BYTES``); 503 before the worker runs.

- ``GET /wire?pod=NAME``: the wire doctor: the pod's last raw batches as received (seq,
  segment, topic, frame layout, how it came, wall time, size, dialect) each decoded field by
  field (``engine.attach.wire.explain``); 404 for a pod attach does not follow.

- ``GET /routers``: what each routing policy of ``kvscope simulate`` would have done with the
  requests seen (``engine.attach.policy_replay``): ``{"step", "requests", "blocks",
  "achieved_hit_rate", "reachable_hit_rate", "policies": {NAME: {"hit_blocks", "hit_rate",
  "requests_per_pod", "models"}}, "capacity_blocks", "series": [{"ts", "requests", "blocks",
  "achieved_blocks", "reachable_blocks", "hit_blocks": {NAME: n}}]}`` (cumulative, one point
  per second of engine time).

All need the server token when one is set (401), and refuse a browser Origin that is not
the dashboard's (403), as the websocket door does.

Writer: none (reads the worker under its lock, in a thread off the event loop).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from engine.attach.locator import LocateError, check_token_ids
from engine.attach.wire import dialect, explain
from engine.server.port.http import CHALLENGE, UNAUTHORIZED, Gate

MAX_BODY_BYTES = 16 << 20  # a prompt of a million token ids fits


def _bad(detail: str, status: int = 400, error: str = "bad_request") -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status)


async def _read_json(request: Request) -> Any:
    size = 0
    parts = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise LocateError(f"the body is over {MAX_BODY_BYTES} bytes")
        parts.append(chunk)
    raw = b"".join(parts)
    if not raw.strip():
        raise LocateError('the body is empty: send {"prompt": "..."} or {"token_ids": [...]}')
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise LocateError(f"the body is not JSON: {exc}") from None


class AttachRoutes:
    def __init__(self, gate: Gate, worker: Callable[[], Any], tokenizer_file: str | None,
                 subscriptions: Callable[[], list[Any]] = list) -> None:
        self.gate, self.worker, self.tokenizer_file = gate, worker, tokenizer_file
        self.subscriptions = subscriptions
        self._tokenizer = None

    def routes(self) -> list[BaseRoute]:
        return [Route("/locate", self.locate, methods=["POST"]),
                Route("/wire", self.wire, methods=["GET", "HEAD"]),
                Route("/routers", self.routers, methods=["GET", "HEAD"])]

    def _refused(self, request: Request) -> Response | None:
        if not self.gate.origin_ok(request):
            return _bad(f"Origin {request.headers.get('origin')!r} may not use this server", 403, "forbidden")
        if not self.gate.authorized(request):
            return JSONResponse(UNAUTHORIZED, 401, CHALLENGE)
        if self.worker() is None:
            return _bad("the attach worker is not running yet", 503, "unavailable")
        return None

    def tokenize(self, text: str, special: bool) -> list[int]:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(self.tokenizer_file)
        return self._tokenizer.encode(text, add_special_tokens=special).ids

    def token_ids(self, body: Any) -> list[int]:
        """The prompt of a /locate body as token ids; LocateError naming what is wrong."""
        if not isinstance(body, dict):
            raise LocateError('the body must be a JSON object: {"prompt": "..."} or {"token_ids": [...]}')
        unknown = sorted(set(body) - {"prompt", "token_ids", "add_special_tokens"})
        if unknown:
            raise LocateError(f"unknown field(s) {', '.join(map(repr, unknown))}: /locate takes "
                              "prompt or token_ids (and add_special_tokens with prompt)")
        has_text, has_ids = "prompt" in body, "token_ids" in body
        if has_text == has_ids:
            raise LocateError("give exactly one of prompt (text) or token_ids (a list of integers)")
        if has_ids:
            return check_token_ids(body["token_ids"])
        text, special = body["prompt"], body.get("add_special_tokens", True)
        if not isinstance(text, str):
            raise LocateError(f"prompt must be a string, got {type(text).__name__} (token ids go in token_ids)")
        if not isinstance(special, bool):
            raise LocateError("add_special_tokens must be true or false")
        if self.tokenizer_file is None:
            raise LocateError("a text prompt needs a tokenizer: start kvscope attach with --tokenizer "
                              "PATH (a tokenizer.json or a model directory), or send token_ids")
        return check_token_ids(self.tokenize(text, special))

    async def locate(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        try:  # off the loop: a long text prompt takes a while to tokenize
            ids = await asyncio.to_thread(self.token_ids, await _read_json(request))
        except LocateError as exc:
            return _bad(str(exc))
        step, found = await asyncio.to_thread(self.worker().locate, ids)
        return JSONResponse({"step": step, "prompt_tokens": len(ids),
                             "pods": [loc.to_dict() for loc in found]})

    async def wire(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        pod = request.query_params.get("pod")
        subs = {s.source.pod: s for s in self.subscriptions()}
        if pod not in subs:
            return _bad(f"no pod {pod!r} here; attach follows {', '.join(map(repr, subs)) or 'none'} "
                        "(ask /wire?pod=NAME)", 404, "not_found")
        return JSONResponse({"pod": pod, "batches": wire_batches(subs[pod].last_frames())})


    async def routers(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        return JSONResponse(await asyncio.to_thread(self.worker().policies))


def wire_batches(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The wire doctor's view of raw batches (newest first)."""
    out = []
    for f in reversed(frames):
        topic = f["topic"]
        out.append({"seq": f["seq"], "segment": f["segment"], "frames": f["frames"], "fill": f["fill"],
                    "wall": f["wall"], "bytes": len(f["payload"]),
                    "topic": None if topic is None else topic.decode("utf-8", "replace"),
                    "dialect": dialect(f["payload"], f["frames"]), "fields": explain(f["payload"])})
    return out
