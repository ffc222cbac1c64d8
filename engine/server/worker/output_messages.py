"""A RequestOutput as protocol messages: ``output`` deltas, then ``finished``.

The websocket door sends these; the engine thread records ``finished_fields``
with the request, so the recording and the ``finished`` message agree.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from engine.outputs import RequestOutput
from engine.protocol.messages import Finished, Message, Output


def output_messages(out: RequestOutput) -> list[Message]:
    """One ``output`` per sample with new text or tokens, then ``finished`` if it is."""
    msgs: list[Message] = [Output(out.request_id, index, text, list(token_ids))
                           for index, (text, token_ids) in sorted(out.deltas.items())
                           if text or token_ids]
    if out.finished:
        outputs, metrics = finished_fields(out)
        msgs.append(Finished(out.request_id, outputs, metrics))
    return msgs


def finished_fields(out: RequestOutput) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ``outputs`` and ``metrics`` of a ``finished`` message (also what is recorded)."""
    outputs = [{"index": c.index, "text": c.text, "token_ids": list(c.token_ids),
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
               for c in out.outputs]
    m = out.metrics
    metrics: dict[str, Any] = {
        "num_prompt_tokens": len(out.prompt_token_ids),
        "num_cached_tokens": out.num_cached_tokens,
        "num_output_tokens": sum(len(c.token_ids) for c in out.outputs),
    }
    if m is not None:
        metrics.update(asdict(m), ttft=m.ttft, e2e=m.e2e)  # its times, then what follows from them
    return outputs, metrics
