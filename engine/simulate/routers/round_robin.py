"""Round-robin: pod k, k+1, ... in turn (Kubernetes' Service load balancing, vLLM's
production-stack router's default ``roundrobin``). Sees nothing."""

from __future__ import annotations

from engine.simulate.routers.base import Router


class RoundRobin(Router):
    name = "round-robin"
    models = "round-robin (Kubernetes Service, vLLM production-stack 'roundrobin')"

    def __init__(self, num_pods: int, block_size: int) -> None:
        super().__init__(num_pods, block_size)
        self.next = 0

    def route(self, req, pods) -> int:
        k, self.next = self.next, (self.next + 1) % self.num_pods
        return k
