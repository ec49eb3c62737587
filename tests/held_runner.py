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
from pathlib import Path

from scratchbank.adapters import runner_process
from scratchbank.adapters.config import bank_folder
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.application.ports import ForwardingBankStore


class HeldBankStore(ForwardingBankStore):
    """A bank store that waits before each put or fetch, saying so on the log."""

    def __init__(self, inner: FilesystemBankStore, log: Path | None, *, put: float, fetch: float) -> None:
        super().__init__(inner)
        self.log, self.waits = log, {"put": put, "fetch": fetch}

    def _say(self, event: str, run_id: str) -> None:
        line = json.dumps({"event": event, "run": run_id}, sort_keys=True) + "\n"
        if self.log is None:
            sys.stdout.write(line)
            sys.stdout.flush()
            return
        with self.log.open("a") as out:
            out.write(line)

    def before(self, call: str, run_id: str) -> None:
        if call in self.waits:
            self._say(f"{call}-started", run_id)
            time.sleep(self.waits[call])


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
