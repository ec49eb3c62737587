"""Where the threads of a phase wait (issue 26): a sampling profiler for ``bench/scale.py``.

py-spy is not installed; this samples ``sys._current_frames()`` every few milliseconds and
counts, for each worker thread, its innermost frame and the innermost frame in the product's
own code (application/, adapters/, domain/). A thread blocked in C (a lock, a sleep, SQLite,
a pipe read) shows as the Python line that called it. ``./dev bench --scale --profile``
adds the top lines per phase to the results (``samples``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from types import FrameType
from typing import Any

PRODUCT = ("/application/", "/adapters/", "/domain/")


def _where(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"


def _line(frame: FrameType | None) -> tuple[str, str]:
    """(innermost frame, innermost product frame with its caller in the product)."""
    if frame is None:
        return "", ""
    inner = _where(frame)
    f: FrameType | None = frame
    while f is not None and not any(p in f.f_code.co_filename for p in PRODUCT):
        f = f.f_back
    own = _where(f) if f is not None else "(outside the product)"
    if f is not None and f.f_back is not None and any(p in f.f_back.f_code.co_filename for p in PRODUCT):
        own = f"{own} <- {_where(f.f_back)}"
    return inner, own


class Sampler:
    """Samples the given threads' stacks until stopped."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.inner: Counter[str] = Counter()
        self.own: Counter[str] = Counter()
        self.pairs: Counter[str] = Counter()
        self.samples = 0
        #: the phase's other threads (an S3 put's thread, the alarm thread...), by name
        self.others: Counter[str] = Counter()
        self.other_samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.watched: set[int] = set()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            frames = sys._current_frames()
            for ident in list(self.watched):
                inner, own = _line(frames.get(ident))
                if inner:
                    self.inner[inner] += 1
                    self.own[own] += 1
                    self.pairs[f"{inner} | {own}"] += 1
                    self.samples += 1
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in frames.items():
                if ident in self.watched or ident == threading.get_ident():
                    continue
                name = names.get(ident, "?").split("-run")[0].rstrip("-0123456789")
                self.others[f"[{name}] {_line(frame)[0]} | {_line(frame)[1]}"] += 1
                self.other_samples += 1
            time.sleep(self.interval)

    def figures(self, top: int = 15) -> dict[str, Any]:
        def share(c: Counter[str]) -> list[tuple[str, float]]:
            return [(k, round(v / max(self.samples, 1), 3)) for k, v in c.most_common(top)]

        return {
            "thread_samples": self.samples,
            "inner": share(self.inner),
            "own": share(self.own),
            "pairs": share(self.pairs),
            "other_thread_samples": self.other_samples,
            "others": [
                (k, round(v / max(self.other_samples, 1), 3)) for k, v in self.others.most_common(top)
            ],
        }


class MemPeak:
    """Where the Python heap stands at its highest (``SCRATCHBANK_SCALE_TRACEMALLOC=1``):
    tracemalloc on, the traced size looked at every ``interval`` s, and a snapshot's top
    lines (by line, then by file) kept whenever it is higher than every look before."""

    def __init__(self, interval: float = 0.1, frames: int = 1) -> None:
        import tracemalloc

        self._tm = tracemalloc
        self.interval = interval
        self.peak = 0
        self.top: list[tuple[str, float, int]] = []
        self.files: list[tuple[str, float]] = []
        self._stop = threading.Event()
        tracemalloc.start(frames)
        self._thread = threading.Thread(target=self._run, name="mem-peak", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            current, _ = self._tm.get_traced_memory()
            if current > self.peak * 1.05:
                self.peak = current
                snap = self._tm.take_snapshot().filter_traces(
                    (self._tm.Filter(False, self._tm.__file__), self._tm.Filter(False, __file__))
                )
                self.top = [
                    (str(s.traceback[0]).rsplit("/", 2)[-1], round(s.size / 2**20, 2), s.count)
                    for s in snap.statistics("lineno")[:20]
                ]
                self.files = [
                    (str(s.traceback[0]).rsplit("site-packages/", 1)[-1], round(s.size / 2**20, 2))
                    for s in snap.statistics("filename")[:15]
                ]

    def figures(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        _, peak = self._tm.get_traced_memory()
        self._tm.stop()
        return {
            "traced_peak_mib": round(peak / 2**20, 1),
            "snapshot_mib": round(self.peak / 2**20, 1),
            "top_lines": self.top,
            "top_files": self.files,
        }
