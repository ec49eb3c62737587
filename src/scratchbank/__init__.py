"""scratchbank: bank a sandboxed run's scratch at teardown, restore it on resume, or
refuse at once with a named cause and a remedy.

The public face: the pure decisions (``scratchbank.domain``), the use cases and the
service over ports (``scratchbank.application``), and the adapters and the bootstrap
(``scratchbank.adapters``). An engine opens one service and calls its use cases::

    >>> import tempfile
    >>> from scratchbank import Consents, FakeSandbox, ResumeRequest, Target, open_home
    >>> from scratchbank.records import node_finished, run_started   # what an engine records
    >>> service = open_home(tempfile.mkdtemp())          # SQLite + banks on disk, created
    >>> ran = node_finished("clone", "tool", in_sandbox=True, on_cycle=False)
    >>> _ = service.timeline.append("run-7", [run_started(), ran])
    >>> report = service.bank_at_teardown("run-7", FakeSandbox({"a.txt": b"kept"}), run_finished=False)
    >>> report.record.banked
    True
    >>> service.status("run-7").assessment.decision.verdict.value    # what a resume would do
    'restore'
    >>> service.resume("run-7")                                      # and nowhere to restore it
    Traceback (most recent call last):
    ...
    scratchbank.domain.errors.NoRestoreTarget: NO_RESTORE_TARGET: run run-7: ... (remedy: pass a Target: ...)
    >>> out = service.resume("run-7", ResumeRequest(), Target(FakeSandbox()))
    >>> out.proceeds, out.restore.record.restored
    (True, True)
    >>> close(service)

The lower-level functions are here too: ``bank_at_teardown(run_id, timeline=..., store=...,
sandbox=..., run_finished=...)``, ``resume(run_id, request, timeline=..., store=...,
sandbox=...)`` (or ``host_directory=``: a ``RestoreTarget`` such as ``HostDirectory(path)``,
or a path this package builds one from), ``check_resume``, ``fold``, ``decide_resume``,
``plan_teardown``.
"""

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scratchbank.adapters.bootstrap import bootstrap, close, open_home
from scratchbank.adapters.config import Settings, open_bank_store, open_sandbox, open_timeline, settings_from
from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.host_directory import HostDirectory
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application import resume as _resume_use_case
from scratchbank.application.ports import (
    BankStore,
    RestoreTarget,
    Sandbox,
    SandboxFacts,
    SnapshotStore,
    StoredBank,
    Timeline,
)
from scratchbank.application.resume import ResumeOutcome, Target, check_resume
from scratchbank.application.service import Assessment, ScratchService, StatusReport, StoreCheck
from scratchbank.application.teardown import Budgets, NothingRecorded, TeardownReport, bank_at_teardown
from scratchbank.domain import *  # noqa: F403 - the domain's __all__ is the public vocabulary
from scratchbank.domain import __all__ as _domain_all
from scratchbank.domain.errors import (
    ConfigInvalid,
    HomeNotFound,
    InvalidRunId,
    NoRestoreTarget,
    ResumeSuperseded,
    RunNotFound,
)
from scratchbank.domain.resume_gate import ResumeRequest

if TYPE_CHECKING:  # imported on first use: their clients (docker, kubernetes, boto3) are slow to load
    from scratchbank.adapters.docker_sandbox import DockerSandbox
    from scratchbank.adapters.k8s_sandbox import KubernetesSandbox
    from scratchbank.adapters.s3_bank import S3BankStore

_LAZY = {
    "DockerSandbox": "scratchbank.adapters.docker_sandbox",
    "KubernetesSandbox": "scratchbank.adapters.k8s_sandbox",
    "S3BankStore": "scratchbank.adapters.s3_bank",
}


def resume(
    run_id: str,
    request: ResumeRequest,
    *,
    host_directory: RestoreTarget | str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> ResumeOutcome:
    """``scratchbank.application.resume.resume``, with ``host_directory`` also as a path:
    a thin convenience that builds its adapter here, ``HostDirectory(path)`` (the use
    case takes the RestoreTarget port and never builds an adapter)."""
    if isinstance(host_directory, str | os.PathLike):
        host_directory = HostDirectory(Path(host_directory))
    return _resume_use_case.resume(run_id, request, host_directory=host_directory, **kwargs)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'scratchbank' has no attribute {name!r}")


__all__ = [
    *_domain_all,
    "Assessment",
    "BankStore",
    "Budgets",
    "ConfigInvalid",
    "DockerSandbox",
    "EventStoreTimeline",
    "FakeSandbox",
    "FilesystemBankStore",
    "HomeNotFound",
    "HostDirectory",
    "InMemoryBankStore",
    "InMemoryTimeline",
    "InvalidRunId",
    "KubernetesSandbox",
    "LocalSandbox",
    "NothingRecorded",
    "NoRestoreTarget",
    "RestoreTarget",
    "ResumeOutcome",
    "ResumeSuperseded",
    "RunNotFound",
    "S3BankStore",
    "Sandbox",
    "SandboxFacts",
    "ScratchService",
    "Settings",
    "SnapshotStore",
    "StatusReport",
    "StoreCheck",
    "StoredBank",
    "Target",
    "TeardownReport",
    "Timeline",
    "bank_at_teardown",
    "bootstrap",
    "check_resume",
    "close",
    "open_bank_store",
    "open_home",
    "open_sandbox",
    "open_timeline",
    "resume",
    "settings_from",
]
