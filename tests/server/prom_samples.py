"""Reading /metrics (or a registry's text) as Prometheus samples, with prometheus_client's parser."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from tests.server.helpers import http_get


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict
    value: float


class Samples:
    """Every sample of one exposition, looked up by name and labels."""

    def __init__(self, text: str) -> None:
        self.types = {}
        self.helps = {}
        self.all: list[Sample] = []
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            self.helps[family.name] = family.documentation
            self.all.extend(Sample(s.name, dict(s.labels), s.value) for s in family.samples)

    def named(self, name: str) -> list[Sample]:
        return [s for s in self.all if s.name == name]

    def get(self, name: str, **labels: str) -> float:
        """The value of the one sample with this name whose labels include ``labels``."""
        found = [s for s in self.named(name) if labels.items() <= s.labels.items()]
        assert len(found) == 1, f"{name}{labels}: {len(found)} samples: {found}"
        return found[0].value

    def buckets(self, name: str, **labels: str) -> list[float]:
        """The ``le`` bounds of a histogram (without +Inf), ascending."""
        les = [s.labels["le"] for s in self.named(f"{name}_bucket")
               if labels.items() <= s.labels.items()]
        return sorted(float(le) for le in les if le != "+Inf")


def scrape(port: int, headers: dict | None = None) -> Samples:
    status, text = http_get(port, "/metrics", headers)
    assert status == 200, text
    return Samples(text)
