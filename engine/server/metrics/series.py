"""The labels every series carries, as vLLM's do: ``model_name`` (the served model name)
and ``engine`` (the engine index; one local engine is ``"0"``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

LABEL_NAMES = ("model_name", "engine")


@dataclass(frozen=True, slots=True)
class Series:
    """Builds families in one registry whose children all carry these two labels."""

    registry: CollectorRegistry
    model_name: str
    engine: str = "0"

    def __post_init__(self) -> None:
        if not isinstance(self.model_name, str) or not self.model_name:
            raise ValueError(f"model_name must be a non-empty string, got {self.model_name!r}")

    @property
    def values(self) -> tuple[str, str]:
        return self.model_name, self.engine

    def one(self, cls: type, name: str, doc: str, **kw: Any) -> Any:
        """A family with just the two labels; returns its only child."""
        return cls(name, doc, LABEL_NAMES, registry=self.registry, **kw).labels(*self.values)

    def by(self, cls: type, name: str, doc: str, label: str, values: tuple[str, ...],
           **kw: Any) -> Children:
        """A family with one more label; its children for ``values`` are exposed from the
        start (at 0, as vLLM pre-creates them), others appear when first used."""
        family = cls(name, doc, (*LABEL_NAMES, label), registry=self.registry, **kw)
        children = Children(lambda v: family.labels(*self.values, v))
        for v in values:
            children[v]  # noqa: B018 - creating the child exposes it
        return children


class Children(dict):
    """Label value -> child of one family, made on first use."""

    def __init__(self, make: Callable[[str], Any]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, value: str) -> Any:
        child = self[value] = self._make(str(value))
        return child

    def labels(self, value: str) -> Any:
        """The child for ``value``, as prometheus_client's ``family.labels(value)`` reads."""
        return self[value]
