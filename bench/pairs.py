"""Figures that hold still: two things timed in turn (A B A B ...), judged by the ratio of each pair.

On a shared, noisy machine the absolute seconds drift between runs; the ratio of two
neighbouring measurements does much less, since both sides see the same load. Each
comparison is one warm-up of each side, then ``n`` pairs; it is reported as the median
of the per-pair ratios A/B with its spread (min-max and the interquartile range).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen
class Pair:
    a: float
    b: float

    @property
    def ratio(self) -> float:
        return self.a / self.b


@attrs.frozen
class Comparison:
    """A/B measured in interleaved pairs."""

    name: str
    a_label: str
    b_label: str
    pairs: tuple[Pair, ...]

    def ratios(self) -> list[float]:
        return sorted(p.ratio for p in self.pairs)

    def median(self) -> float:
        return statistics.median(self.ratios())

    def iqr(self) -> tuple[float, float]:
        r = self.ratios()
        if len(r) < 4:
            return r[0], r[-1]
        q = statistics.quantiles(r, n=4)
        return q[0], q[2]

    def as_json(self) -> dict[str, Any]:
        r = self.ratios()
        return {
            "name": self.name,
            "a": self.a_label,
            "b": self.b_label,
            "pairs": [[round(p.a, 4), round(p.b, 4)] for p in self.pairs],
            "median_a_s": statistics.median(p.a for p in self.pairs),
            "median_b_s": statistics.median(p.b for p in self.pairs),
            "median_ratio": self.median(),
            "min_ratio": r[0],
            "max_ratio": r[-1],
            "iqr_ratio": list(self.iqr()),
        }

    def line(self) -> str:
        lo, hi = self.iqr()
        r = self.ratios()
        a = statistics.median(p.a for p in self.pairs)
        b = statistics.median(p.b for p in self.pairs)
        return (
            f"{self.name:44} {self.a_label} {a:7.3f}s / {self.b_label} {b:7.3f}s = "
            f"{self.median():5.2f}x  (IQR {lo:.2f}-{hi:.2f}, min-max {r[0]:.2f}-{r[-1]:.2f}, n={len(r)})"
        )


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@attrs.frozen
class Side:
    """One side of a comparison: what is timed, and what is prepared untimed before it."""

    label: str
    run: Callable[[], object]
    prepare: Callable[[], object] | None = None

    def timed(self) -> float:
        if self.prepare is not None:
            self.prepare()
        return seconds(self.run)


def interleaved(name: str, a: Side, b: Side, n: int, *, warmup: bool = True) -> Comparison:
    """Run A then B, ``n`` times, after one warm-up of each; every pair is one ratio."""
    if warmup:
        a.timed()
        b.timed()
    pairs = tuple(Pair(a.timed(), b.timed()) for _ in range(n))
    return Comparison(name, a.label, b.label, pairs)


@attrs.frozen
class Goal:
    """A goal on a comparison's median ratio: PASS when it is at most ``limit``."""

    name: str
    limit: float
    comparison: Comparison | None = None
    value: float | None = None  # for goals that are not ratios (MiB)
    unit: str = "x"

    def measured(self) -> float:
        if self.comparison is not None:
            return self.comparison.median()
        assert self.value is not None
        return self.value

    def passed(self) -> bool:
        return self.measured() <= self.limit

    def line(self) -> str:
        verdict = "PASS" if self.passed() else "MISS"
        spread = ""
        if self.comparison is not None:
            r = self.comparison.ratios()
            spread = f" (min-max {r[0]:.2f}-{r[-1]:.2f})"
        return f"  {verdict}  {self.name}: {self.measured():.2f}{self.unit}{spread}, goal <= {self.limit}{self.unit}"

    def as_json(self) -> dict[str, Any]:
        return {"goal": self.name, "limit": self.limit, "measured": self.measured(), "pass": self.passed()}

    @staticmethod
    def limit_for(name: str) -> float | None:
        """The issue's goals (#14): bank <= 0.5x the floor and the by-hand pipeline, restore <= 1x."""
        return LIMITS.get(name.split(" ", 1)[0])

    @classmethod
    def of(cls, comparison: dict[str, Any]) -> Goal:
        """A goal on a comparison as saved (as_json): judged on its median ratio."""
        limit = cls.limit_for(comparison["name"])
        assert limit is not None
        spread = f" (min-max {comparison['min_ratio']:.2f}-{comparison['max_ratio']:.2f})"
        return cls(comparison["name"] + spread, limit, value=comparison["median_ratio"])


LIMITS = {"bank/floor": 0.5, "bank/by-hand": 0.5, "restore/bare-extract": 1.0}
