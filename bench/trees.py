"""The scratch trees the benchmarks bank, generated once and cached.

- ``source``: botocore, hypothesis and pip sources (~31 MB, ~3.6k files): a code checkout;
- ``mixed``: the source tree, 80 MB of random binaries and 90 MB of logs (~205 MB);
- ``gigabyte``: ~1 GB, mostly incompressible (96 x 10 MB random, 40 MB of logs);
- ``ten_mb``: 10 MB random (the small end of the memory curve);
- ``thousand`` / ``million``: 1,000 and 1,000,000 tiny files in folders of 1,000.

Cached under ``$SCRATCHBANK_BENCH_CACHE`` (default /var/cache/scratchbank/bench-trees);
a tree is complete once its ``NAME.complete`` marker sits beside it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

CACHE = Path(os.environ.get("SCRATCHBANK_BENCH_CACHE", "/var/cache/scratchbank/bench-trees"))
LOG_LINE = b"2026-11-29T10:00:00Z INFO step=%d measured floor=12.5 ms ok\n"


def _source(dest: Path) -> None:
    site = Path(__import__("botocore").__file__).parent.parent
    for pkg in ("botocore", "hypothesis", "pip"):
        shutil.copytree(site / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__"))


def _log(path: Path, lines: int) -> None:
    with open(path, "wb") as log:
        for i in range(lines):
            log.write(LOG_LINE % i)


def _blobs(dest: Path, count: int, size: int = 10 << 20) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (dest / f"blob{i:03}.bin").write_bytes(os.urandom(size))


def _mixed(dest: Path) -> None:
    _source(dest / "src")
    _blobs(dest / "bin", 8)
    _log(dest / "run.log", 1_400_000)


def _gigabyte(dest: Path) -> None:
    _blobs(dest / "bin", 96)
    _log(dest / "run.log", 620_000)


def _tiny(count: int) -> Callable[[Path], None]:
    def make(dest: Path) -> None:
        for d in range(max(1, count // 1000)):
            folder = dest / f"d{d:04}"
            folder.mkdir()
            for f in range(min(1000, count)):
                (folder / f"f{f:03}").write_bytes(b"tiny %d %d\n" % (d, f))

    return make


MAKERS: dict[str, Callable[[Path], None]] = {
    "source": _source,
    "mixed": _mixed,
    "gigabyte": _gigabyte,
    "ten_mb": lambda dest: _blobs(dest, 1),
    "thousand": _tiny(1000),
    "million": _tiny(1_000_000),
}


def tree(name: str) -> Path:
    """The cached tree ``name``, made first if it is not complete."""
    path, done = CACHE / name, CACHE / f"{name}.complete"
    if not done.exists():
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        MAKERS[name](path)
        done.write_text("")
    return path


def stats(path: Path) -> tuple[int, int]:
    """(bytes in regular files, entries) of a tree."""
    size = entries = 0
    for root, dirs, files in os.walk(path):
        entries += len(dirs) + len(files)
        size += sum(os.lstat(os.path.join(root, f)).st_size for f in files)
    return size, entries
