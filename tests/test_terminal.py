"""Progress for people (finding 6): a bar per stage on a terminal, one plain line per stage
elsewhere, and never a stage twice however often the use case reports it."""

from __future__ import annotations

import io

from scratchbank.adapters.terminal import StageProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def report_twice(progress: StageProgress) -> None:
    """What a restore reports: a stage's end can come twice (a last empty read)."""
    for stage, done, total in [("fetched", 10, 10), ("checked", 10, 10), ("streamed", 4, 10), ("streamed", 10, 10), ("streamed", 10, 10)]:  # fmt: skip
        progress(stage, done, total)
    progress.close()


def test_plain_lines_off_a_terminal_each_stage_once() -> None:
    """Off a terminal: one plain line per stage, in order, none twice."""
    out = io.StringIO()
    report_twice(StageProgress(out))
    assert [line.split(":")[0].strip() for line in out.getvalue().splitlines()] == [
        "fetched",
        "checked",
        "streamed",
    ]


def test_bars_on_a_terminal_each_stage_once() -> None:
    """On a terminal: a tqdm bar per stage, each finished once."""
    out = Terminal()
    progress = StageProgress(out)
    report_twice(progress)
    text = out.getvalue()
    assert progress.finished == ["fetched", "checked", "streamed"]
    assert "streamed" in text and "100%" in text and "\r" in text
