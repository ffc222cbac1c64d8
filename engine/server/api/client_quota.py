"""ClientQuota: generation requests in flight over the OpenAI API, per client address.

A websocket connection may hold ``--max-in-flight`` requests (the RequestBook counts per
sink), but every HTTP call is a sink of its own, so one client opening a thousand calls
at once was bounded only by the engine's waiting queue, which every other client needs
too. The quota counts the engine requests (one per prompt) of a client address's open
generation calls; a call that would pass ``--max-api-in-flight`` is refused with 429
``too_many_in_flight`` before anything is queued. On a loopback server every local
client shares 127.0.0.1, so the default (128: twice the default ``max_num_seqs``) lets
one address keep the batch full with as many waiting, not fill the whole queue.

Writer: the loop thread (the route handlers), only.
"""

from __future__ import annotations

from engine.openai.errors import ApiError

DEFAULT_MAX_API_IN_FLIGHT = 128


class ClientQuota:
    def __init__(self, limit: int = DEFAULT_MAX_API_IN_FLIGHT) -> None:
        self.limit = limit  # checked by ServerOptions (--max-api-in-flight)
        self._held: dict[str, int] = {}  # client address -> requests of its open calls

    def held(self, client: str) -> int:
        return self._held.get(client, 0)

    def take(self, client: str, n: int) -> None:
        """Count ``n`` more requests for ``client``; 429 (and nothing counted) past the limit."""
        have = self._held.get(client, 0)
        if have + n > self.limit:
            raise ApiError(429, f"this client ({client}) has {have} generation request(s) in flight "
                                f"over the API and this call adds {n}; the server takes at most "
                                f"{self.limit} per client (--max-api-in-flight): wait for one to finish",
                           "rate_limit_error", None, "too_many_in_flight")
        self._held[client] = have + n

    def give_back(self, client: str, n: int) -> None:
        left = self._held.get(client, 0) - n
        if left > 0:
            self._held[client] = left
        else:
            self._held.pop(client, None)
