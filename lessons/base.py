"""What a lesson is: narrative, questions, a scenario to run, and what the run answers.

Plain Python with no torch import, so the dashboard can list lessons and show
their text without loading a model. ``Lesson.models`` names the behaviours a lesson
describes (``engine.events.versions``); its text tags each one with the vLLM version
(or the paper) it follows, e.g. "[vLLM v1 (0.x)]". A lesson's ``run(ctx)`` gets a
``lessons.runner.LessonContext`` (which owns the engines) and returns a
``LessonResult`` whose answers are computed from the run, never written by hand.

Charts are small JSON-able dicts the CLI prints and the dashboard draws:
- ``bars``: ``categories`` (x labels) and ``series`` [{name, values}] (one value per category);
- ``lines``: ``series`` [{name, x, y}];
- ``table``: ``columns`` and ``rows`` (lists of cells).
Each also has ``title`` and optional ``x_label``, ``y_label``, ``note``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.events.versions import Behaviour


@dataclass(frozen=True, slots=True)
class Question:
    """A "predict, then look" question. With ``options`` it is multiple choice;
    without, the answer is a number."""

    key: str
    prompt: str
    options: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "prompt": self.prompt, "options": list(self.options),
                "kind": "choice" if self.options else "number"}


@dataclass(slots=True)
class Answer:
    """The answer one run gave: ``value`` (JSON-able numbers), the ``option`` those
    numbers select (choice questions) and an ``explanation`` quoting them."""

    value: Any
    explanation: str
    option: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "option": self.option, "explanation": self.explanation}


@dataclass(slots=True)
class LessonResult:
    """What ``Lesson.run`` returns. ``focus`` is (trace, step): the pool view worth
    looking at; ``facts`` are headline numbers for reports."""

    answers: dict[str, Answer]
    charts: list[dict[str, Any]]
    focus: tuple[Any, int] | None = None
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Lesson:
    number: int
    slug: str
    title: str
    short: str  # for run labels: "lesson 5: prefix caching (block_size 16)"
    sections: tuple[str, ...]  # the narrative, one markdown page per section
    questions: tuple[Question, ...]
    takeaway: str
    run: Callable[[Any], LessonResult]
    # the behaviours the lesson describes (engine.events.versions); its text tags each
    # with the version of vLLM (or the paper) it follows
    models: tuple[Behaviour, ...] = ()

    def catalog(self) -> dict[str, Any]:
        """Everything a learner sees before running the scenario (JSON-able)."""
        return {"number": self.number, "slug": self.slug, "title": self.title,
                "short": self.short, "sections": list(self.sections),
                "questions": [q.to_dict() for q in self.questions], "takeaway": self.takeaway,
                "models": [{"key": b.key, "label": b.label, "what": b.what, "where": b.where}
                           for b in self.models]}

    def check(self, result: LessonResult) -> None:
        """Every question answered, and each option one of the question's options."""
        for q in self.questions:
            a = result.answers.get(q.key)
            if a is None:
                raise AssertionError(f"lesson {self.number}: no answer for {q.key!r}")
            if q.options and a.option not in q.options:
                raise AssertionError(f"lesson {self.number}: {q.key!r} answered {a.option!r}, "
                                     f"not one of {q.options}")
        extra = set(result.answers) - {q.key for q in self.questions}
        if extra:
            raise AssertionError(f"lesson {self.number}: answers for unknown questions {extra}")


# ---- chart specs --------------------------------------------------------------

def bars(title: str, categories: Sequence[Any], series: dict[str, Sequence[Any]], *,
         x_label: str = "", y_label: str = "", note: str = "") -> dict[str, Any]:
    return {"kind": "bars", "title": title, "categories": [str(c) for c in categories],
            "series": [{"name": k, "values": list(v)} for k, v in series.items()],
            "x_label": x_label, "y_label": y_label, "note": note}


def lines(title: str, series: dict[str, tuple[Sequence[Any], Sequence[Any]]], *,
          x_label: str = "step", y_label: str = "", note: str = "") -> dict[str, Any]:
    return {"kind": "lines", "title": title,
            "series": [{"name": k, "x": list(x), "y": list(y)} for k, (x, y) in series.items()],
            "x_label": x_label, "y_label": y_label, "note": note}


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
          note: str = "") -> dict[str, Any]:
    return {"kind": "table", "title": title, "columns": list(columns),
            "rows": [list(r) for r in rows], "note": note}


# ---- turning numbers into options ----------------------------------------------

def lower_same_higher(new: float, old: float, options: Sequence[str], tol: float = 0.2) -> str:
    """options = (lower, about the same, higher): ``new`` against ``old`` with a
    relative tolerance, so timing noise does not flip a tie into a claim."""
    if new < old * (1 - tol):
        return options[0]
    if new > old * (1 + tol):
        return options[2]
    return options[1]


def argmax_option(values: dict[str, float], options: Sequence[str]) -> str:
    """The option whose value is largest (the first one on a tie)."""
    best = max(values[o] for o in options)
    return next(o for o in options if values[o] == best)


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.0f} ms"
