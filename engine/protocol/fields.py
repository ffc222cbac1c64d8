"""The one field codec of ops and messages: a frozen dataclass's fields as the ``{"type":
<name>, **fields}`` object of the wire, and back. A field whose wire form is not its
value (a snapshot, a list of step records, sampling params) says how to convert it
with ``converted``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, field, fields
from typing import Any


def converted(to_wire: Callable[[Any], Any], from_wire: Callable[[Any], Any] = lambda v: v,
              **kw: Any) -> Any:
    """A dataclass field written as ``to_wire(value)`` and read back with ``from_wire``."""
    return field(metadata={"wire": (to_wire, from_wire)}, **kw)


def to_wire(obj: Any, drop_none: bool = False) -> dict[str, Any]:
    """``{"type": obj.type, **fields}``, shallow (not ``dataclasses.asdict``, which deep-copies:
    a snapshot's state is big); ``drop_none`` leaves out fields that are None."""
    out: dict[str, Any] = {"type": obj.type}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if v is None and drop_none:
            continue
        wire = f.metadata.get("wire")
        out[f.name] = wire[0](v) if wire else v
    return out


def from_wire(cls: type, d: dict[str, Any], missing: Any = MISSING) -> dict[str, Any]:
    """The keyword arguments of ``cls`` that ``d`` gives (other keys are ignored); a field
    without a default that ``d`` leaves out is ``missing`` (by default left out too)."""
    kw: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in d:
            wire = f.metadata.get("wire")
            kw[f.name] = wire[1](d[f.name]) if wire else d[f.name]
        elif missing is not MISSING and f.default is MISSING and f.default_factory is MISSING:
            kw[f.name] = missing
    return kw
