"""How an async engine calls the (blocking) teardown use case, for the tests of T7: in an
executor thread, shielded, so the run's own cancellation (a drain, a lost lease) cancels
the engine's await but not the banking, which runs to its own budgets.

The product ships no async wrapper (an engine owns its event loop); this is the rig the
T7 tests drive ``bank_at_teardown`` through."""

from __future__ import annotations

import asyncio
from typing import Any

from scratchbank.application.teardown import TeardownReport, bank_at_teardown


async def bank_at_teardown_shielded(**kwargs: Any) -> TeardownReport:
    """T7: runs to its own budgets even when the awaiting task (the run) is cancelled."""
    loop = asyncio.get_running_loop()
    return await asyncio.shield(loop.run_in_executor(None, lambda: bank_at_teardown(**kwargs)))
