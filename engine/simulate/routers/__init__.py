"""Routers for ``kvscope simulate --router``: one module each, each modelling a real one.

A router picks the pod of each arriving request from what its real counterpart sees:
queue lengths (scraped from ``/metrics``), the pods' KV event feed (``observe``), its
own past decisions, or (the oracle only) every pod's true cache. ``ROUTERS`` maps the
``--router`` names to the classes.
"""

from __future__ import annotations

from engine.simulate.routers.approx_prefix import ApproxPrefix
from engine.simulate.routers.base import Routed, Router
from engine.simulate.routers.dynamo import DynamoCost
from engine.simulate.routers.least_loaded import LeastLoaded
from engine.simulate.routers.oracle import Oracle
from engine.simulate.routers.precise_prefix import PrecisePrefix
from engine.simulate.routers.round_robin import RoundRobin

ROUTERS: dict[str, type[Router]] = {cls.name: cls for cls in (
    RoundRobin, LeastLoaded, PrecisePrefix, ApproxPrefix, DynamoCost, Oracle)}

__all__ = ["ROUTERS", "Routed", "Router"]
