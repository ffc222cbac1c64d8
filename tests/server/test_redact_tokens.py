"""Issue 17 "privacy": with ``--redact-tokens`` watchers see ids, counts and hashes but
no token ids, in steps, steps_since answers and snapshots; each submitter still gets its
own outputs. Without it (main at 7416b2c, and the default) every watcher sees every
request's token ids, as the first half checks."""

from __future__ import annotations

from tests.server.helpers import GREEDY, raw, recv_until, send

TOKEN_FIELDS = ("token_ids", "prompt_token_ids", "new_token_ids")


def _tokens_seen(msgs: list[dict]) -> list[int]:
    """Every token id a watcher saw in events and snapshots."""
    out: list[int] = []
    for m in msgs:
        events = m.get("events", []) if m["type"] == "step" else \
            [e for s in m.get("steps", []) for e in s["events"]] if m["type"] == "steps" else []
        for e in events:
            for f in TOKEN_FIELDS:
                out.extend(e.get(f) or ())
        if m["type"] == "snapshot":
            for b in m["state"]["blocks"]:
                out.extend(b["token_ids"] or ())
            for r in m["state"]["requests"].values():
                out.extend(r["token_ids"] or ())
    return out


def _watch_one_request(server) -> tuple[list[dict], dict]:
    watcher, submitter = raw(server.url), raw(server.url)
    send(submitter, type="submit", prompt="a secret prompt", params={**GREEDY, "max_tokens": 40},
         request_id="s")
    recv_until(submitter, lambda m: m["type"] == "output")
    send(watcher, type="snapshot")  # mid-request: the pool holds its tokens
    fin, _ = recv_until(submitter, lambda m: m["type"] == "finished")
    send(watcher, type="steps_since", seq=-1)  # the step history, from the start
    steps, seen = recv_until(watcher, lambda m: m["type"] == "steps")
    watcher.close()
    submitter.close()
    return seen + [steps], fin


def test_watchers_see_every_token_by_default(make_server):
    seen, fin = _watch_one_request(make_server())
    assert len(fin["outputs"][0]["token_ids"]) == 40
    assert any(m["type"] == "snapshot" for m in seen) and _tokens_seen(seen)


def test_redact_tokens_leaves_watchers_ids_and_counts_only(make_server):
    server = make_server(redact_tokens=True)
    seen, fin = _watch_one_request(server)
    assert len(fin["outputs"][0]["token_ids"]) == 40  # the submitter's own outputs
    assert _tokens_seen(seen) == []
    events = [e for m in seen if m["type"] == "step" for e in m["events"]]
    arrived = next(e for e in events if e["type"] == "request_arrived")
    assert arrived["request_id"] == "s" and arrived["num_prompt_tokens"] > 0
    assert any(e["type"] == "block_allocated" for e in events)
    assert any(m["type"] == "snapshot" and m["state"]["requests"] for m in seen)
