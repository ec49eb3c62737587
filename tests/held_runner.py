"""The runner process with its bank store held before each put or fetch (fault tests only).

    python tests/held_runner.py --slow-put SECONDS --slow-fetch SECONDS <runner_process args>

Each held call is announced on the runner's ``--log`` (``put-started``, ``fetch-started``)
so that a test can kill the process in the middle of a teardown or a restore. The product's
runner process takes no such flag: this wraps its store from outside.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from scratchbank.adapters import runner_process
from scratchbank.adapters.config import bank_folder
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.application.cancellation import Deadline
from scratchbank.application.ports import StoredBank
from scratchbank.domain.objects import BankStamp, StoredObject


class HeldBankStore:
    """A bank store that waits before each put or fetch, saying so on the log."""

    def __init__(self, inner: FilesystemBankStore, log: Path | None, *, put: float, fetch: float) -> None:
        self.inner, self.log, self.put_wait, self.fetch_wait = inner, log, put, fetch
        self.keeps_banks = inner.keeps_banks

    def _say(self, event: str, run_id: str) -> None:
        line = json.dumps({"event": event, "run": run_id}, sort_keys=True) + "\n"
        if self.log is None:
            sys.stdout.write(line)
            sys.stdout.flush()
            return
        with self.log.open("a") as out:
            out.write(line)

    def put(
        self,
        run_id: str,
        archive: Path,
        *,
        sha256: str,
        stamp: BankStamp | None = None,
        deadline: Deadline | None = None,
    ) -> str:
        self._say("put-started", run_id)
        time.sleep(self.put_wait)
        return self.inner.put(run_id, archive, sha256=sha256, stamp=stamp, deadline=deadline)

    def fetch(
        self,
        run_id: str,
        dest: BinaryIO,
        *,
        max_bytes: int,
        name: str | None = None,
        deadline: Deadline | None = None,
    ) -> StoredBank:
        self._say("fetch-started", run_id)
        time.sleep(self.fetch_wait)
        return self.inner.fetch(run_id, dest, max_bytes=max_bytes, name=name, deadline=deadline)

    def delete(self, run_id: str, name: str | None = None) -> None:
        self.inner.delete(run_id, name)

    def sweep(self, run_id: str) -> None:
        self.inner.sweep(run_id)

    def stat(self, run_id: str, name: str | None = None) -> StoredBank | None:
        return self.inner.stat(run_id, name)

    def objects(self, run_id: str) -> Sequence[StoredObject]:
        return self.inner.objects(run_id)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--slow-put", type=float, default=0.0)
    p.add_argument("--slow-fetch", type=float, default=0.0)
    p.add_argument("--log", type=Path)
    held, rest = p.parse_known_args()
    if held.log is not None:
        rest += ["--log", str(held.log)]

    def store(url: str) -> HeldBankStore:
        return HeldBankStore(
            FilesystemBankStore(bank_folder(url)), held.log, put=held.slow_put, fetch=held.slow_fetch
        )

    runner_process.open_bank_store = store  # type: ignore[assignment]
    return runner_process.main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
