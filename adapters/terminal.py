"""For people at a terminal: progress of a restore's stages, and log lines (text or JSON).

On a terminal each stage gets a tqdm bar; elsewhere (a pipe, a log file) each stage is
one plain line, printed once when it completes, however often the use case reports it.
"""

from __future__ import annotations

import json
import logging
import shutil
from typing import Any, TextIO


class StageProgress:
    """A ``Progress`` callback (stage, done, total) that shows each stage once."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.finished: list[str] = []
        self._bars: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage in self.finished:
            return
        if self.tty:
            self._bar(stage, total).update(done - self._bars[stage].n)
        if done >= total:
            self._finish(stage, total)

    def _bar(self, stage: str, total: int) -> Any:
        if stage not in self._bars:
            from tqdm import tqdm

            # a terminal that reports a 0x0 window (a bare pty) would hide every bar: 80x24 then
            size = shutil.get_terminal_size()
            shape = {"ncols": size.columns, "nrows": size.lines}
            # binary units, and no rate: the first update of a fast stage read "298GB/s"
            bar = tqdm(
                total=total,
                desc=stage,
                unit="iB",
                unit_scale=True,
                unit_divisor=1024,
                file=self.stream,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}]",
                **shape,
            )
            self._bars[stage] = bar
        return self._bars[stage]

    def _finish(self, stage: str, total: int) -> None:
        self.finished.append(stage)
        if stage in self._bars:
            self._bars.pop(stage).close()
        else:
            from .present import human_bytes

            print(f"  {stage}: {human_bytes(total)}", file=self.stream, flush=True)

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()


class JsonLines(logging.Formatter):
    """One JSON object per log record: time, level, logger, message."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
                "level": record.levelname.lower(),
                "logger": record.name,
                "message": record.getMessage(),
            }
        )


def configure_logging(stream: TextIO, *, fmt: str, level: str) -> None:
    """Route the ``scratchbank`` loggers to ``stream``, as text or JSON lines."""
    handler = logging.StreamHandler(stream)
    text = logging.Formatter("scratchbank: %(levelname)s %(message)s")
    handler.setFormatter(JsonLines() if fmt == "json" else text)
    logger = logging.getLogger("scratchbank")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
